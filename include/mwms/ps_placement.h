/// @file ps_placement.h
/// Variable placement on parameter-server (ps) tasks, as TensorFlow's TF 1 graph API does it:
/// tf.compat.v1.get_variable with a partitioner (fixed_size_partitioner,
/// min_max_variable_partitioner) under tf.compat.v1.train.replica_device_setter with its
/// round-robin ps_strategy or GreedyLoadBalancingStrategy(num_ps, byte_size_load_fn). Pure
/// functions of their arguments: nothing here talks to a ps task. Checked against vectors written
/// by TensorFlow 2.21 itself (scripts/tf_ps_vectors.py, Note [TF placement semantics] in
/// src/strategy/ps/placement.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mwms/api.h"
#include "mwms/types.h"

namespace mwms {

/// A variable as the caller declares it (tf.Variable / tf.compat.v1.get_variable): its name, its
/// shape (dimensions in elements, row-major, axis 0 first; empty for a scalar) and its dtype.
struct MWMS_API VariableSpec {
  std::string name;                 ///< TF's variable name, e.g. "dense/kernel"; unique, not empty
  std::vector<std::int64_t> shape;  ///< dimensions, each >= 0; {} is a scalar
  DataType dtype = DataType::kFloat32;  ///< element type (dtype_size bytes per element)
};

/// How many slices a variable is cut into along axis 0, after the tf.compat.v1 partitioners. A
/// value type: immutable once built, so const members may be called from any thread at once.
/// Only axis 0 is supported (TF's default `axis=0`).
class MWMS_API Partitioner {
 public:
  /// Which tf.compat.v1 partitioner this is.
  enum class Kind : std::uint8_t {
    kNone = 0,       ///< get_variable without a partitioner: every variable stays whole
    kFixedSize = 1,  ///< fixed_size_partitioner
    kMinMax = 2,     ///< min_max_variable_partitioner
  };

  /// No partitioning: one whole variable, named as declared (get_variable(partitioner=None)).
  Partitioner() = default;

  /// tf.compat.v1.fixed_size_partitioner(num_shards, axis=0): min(num_shards, shape[0]) slices.
  /// @throws InvalidArgument when num_shards < 1 (TF accepts it and raises "zero partitions" at
  /// the first non-scalar variable; libmwms rejects the partitioner itself).
  static Partitioner fixed_size(int num_shards);

  /// tf.compat.v1.min_max_variable_partitioner(max_partitions, axis=0, min_slice_size): as many
  /// slices as keep each at least `min_slice_size` bytes, i.e.
  /// max(1, min(shape[0], max_partitions, ceil(bytes / min_slice_size))), where bytes is the
  /// whole variable's size (elements * dtype_size). Computed in integers: equal to TF's float
  /// division for variables below 2^53 bytes.
  /// @throws InvalidArgument when max_partitions < 1 (TF silently uses 1) or min_slice_size < 1
  /// (TF raises ZeroDivisionError for 0 and silently uses 1 partition for a negative size).
  static Partitioner min_max(int max_partitions = 1, std::int64_t min_slice_size = 256 << 10);

  /// Whether TF makes a PartitionedVariable of a variable of this shape: a partitioner is set and
  /// the shape is not a scalar (get_variable skips the partitioner for shape []). A partitioned
  /// variable's slices are named "name/part_K", even when there is only one. Never throws.
  bool is_partitioned(const std::vector<std::int64_t>& shape) const noexcept;

  /// Number of slices of axis 0 TF makes for this shape and dtype: partitions[0] as the
  /// partitioner returns it, after the variable store's checks (_call_partitioner, _PartitionInfo).
  /// 1 when !is_partitioned(shape) (no partitioner, or a scalar). Never more than shape[0], so no
  /// slice is empty.
  /// @throws InvalidArgument for a negative dimension (TF: "Dimension -1 must be >= 0"), for
  /// fixed_size with shape[0] == 0 (TF: "Partitioner returned zero partitions"), for any
  /// partitioned shape with a zero dimension (TF: "Expected 0 <= offset < shape"), and for a
  /// shape whose element or byte count overflows std::int64_t.
  int num_partitions(const std::vector<std::int64_t>& shape, DataType dtype) const;

  /// "none", "fixed_size(4)" or "min_max(8, 262144)" (max_partitions, min_slice_size in bytes).
  std::string describe() const;

  /// Which partitioner this is.
  Kind kind() const noexcept { return kind_; }
  /// fixed_size's num_shards; 0 for the other kinds.
  int num_shards() const noexcept { return kind_ == Kind::kFixedSize ? limit_ : 0; }
  /// min_max's max_partitions; 0 for the other kinds.
  int max_partitions() const noexcept { return kind_ == Kind::kMinMax ? limit_ : 0; }
  /// min_max's min_slice_size in bytes; 0 for the other kinds.
  std::int64_t min_slice_size() const noexcept { return min_slice_size_; }

  /// Same kind and parameters.
  friend bool operator==(const Partitioner& a, const Partitioner& b) noexcept {
    return a.kind_ == b.kind_ && a.limit_ == b.limit_ && a.min_slice_size_ == b.min_slice_size_;
  }
  /// Not operator==.
  friend bool operator!=(const Partitioner& a, const Partitioner& b) noexcept { return !(a == b); }

 private:
  Kind kind_ = Kind::kNone;
  int limit_ = 0;  // num_shards or max_partitions
  std::int64_t min_slice_size_ = 0;
};

/// Which ps task gets each variable op: tf.compat.v1.train.replica_device_setter's ps_strategy.
enum class PsPlacement : std::uint8_t {
  kRoundRobin = 0,  ///< the default _RoundRobinStrategy: the k-th variable op goes to ps k % num_ps
  kGreedyByBytes =
      1,  ///< GreedyLoadBalancingStrategy(num_ps, byte_size_load_fn): least bytes so far
};

/// "round_robin" or "greedy". Never throws.
MWMS_API std::string_view to_string(PsPlacement placement) noexcept;

/// Parses "round_robin" or "greedy" (exactly, lower case). @throws InvalidArgument otherwise.
MWMS_API PsPlacement parse_ps_placement(std::string_view name);

/// One slice of one variable, placed on one ps task: one VariableV2/VarHandleOp in TF's graph.
struct MWMS_API VariableShard {
  int variable = 0;                ///< index into the VariableSpec list
  int shard = 0;                   ///< 0..num_shards-1 ("name/part_<shard>" in TF when partitioned)
  int num_shards = 1;              ///< slices of this variable
  bool partitioned = false;        ///< TF made a PartitionedVariable (Partitioner::is_partitioned)
  int ps_task = 0;                 ///< ps task index, 0..num_ps-1 ("/job:ps/task:<ps_task>")
  std::int64_t row_offset = 0;     ///< first row (axis 0) of this slice (TF's var_offset[0])
  std::int64_t rows = 0;           ///< rows of this slice: TF's _iter_slices gives the first
                                   ///< (shape[0] % num_shards) slices one extra row; 1 for a scalar
  std::size_t element_offset = 0;  ///< offset of the slice's first element in the whole
                                   ///< variable (row-major), in elements
  std::size_t count = 0;           ///< elements in the slice (its bytes: count * dtype_size)
  std::string name;  ///< TF's op name: the variable's name, or "name/part_<shard>" when
                     ///< partitioned (even when num_shards == 1)
};

/// Places every variable (in list order, as TF creates ops in graph order) and every slice of it
/// (slices 0..n-1 in order, each placed as its own variable op, as TF does) on `num_ps` tasks.
/// kRoundRobin: the k-th placed slice over the whole list goes to ps k % num_ps (the counter runs
/// across variables and across slices). kGreedyByBytes: each slice goes to the ps holding the
/// fewest bytes so far (ties: the lowest index), which then holds count * dtype_size more.
/// Returns one VariableShard per slice, in placement order. Pure: safe to call from any thread.
/// @throws InvalidArgument: num_ps < 1, an empty name (TF accepts ""), a duplicate name or a
/// slice name equal to another variable's name (TF: "already exists"), more than INT_MAX
/// variables, or anything Partitioner::num_partitions throws for (negative or, when partitioned,
/// zero dimensions; overflow).
MWMS_API std::vector<VariableShard> place_variables(
    const std::vector<VariableSpec>& variables, int num_ps,
    PsPlacement placement = PsPlacement::kRoundRobin, const Partitioner& partitioner = {});

/// Bytes each ps task holds for `shards` (count * dtype_size of the shard's variable), indexed by
/// ps task; size num_ps. Pure: safe to call from any thread.
/// @throws InvalidArgument: num_ps < 1, a shard whose `variable` is not an index into
/// `variables` or whose ps_task is not in 0..num_ps-1.
MWMS_API std::vector<std::size_t> bytes_per_ps(const std::vector<VariableShard>& shards,
                                               const std::vector<VariableSpec>& variables,
                                               int num_ps);

}  // namespace mwms
