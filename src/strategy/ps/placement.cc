// Variable placement on ps tasks and TF's axis-0 partitioners (mwms/ps_placement.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mwms/errors.h"
#include "mwms/ps_placement.h"

namespace mwms {

// Note [TF placement semantics]: what TensorFlow 2.21 does, read from its source and confirmed
// by tests/data/ps/tf_placement_vectors.json (scripts/tf_ps_vectors.py):
//  - replica_device_setter calls ps_strategy once per variable op (VariableV2 or VarHandleOp),
//    in creation order. A partitioned variable is one op per slice ("name/part_K", K = 0..n-1,
//    created in order), so the round-robin counter advances per slice, across variables.
//  - get_variable ignores the partitioner for a scalar (shape []): one plain variable. Any other
//    shape with a partitioner becomes a PartitionedVariable, named "name/part_K" even for n = 1.
//  - fixed_size_partitioner returns min(num_shards, shape[0]); min_max_variable_partitioner
//    returns max(1, min(shape[0], max_partitions, ceil(bytes / min_slice_size))). Both clamp to
//    shape[0], so there are never more slices than rows and no slice is empty.
//  - The variable store then rejects 0 partitions (fixed_size on shape[0] == 0) and, in
//    _PartitionInfo, any zero dimension of a partitioned variable (offset 0 is not < 0).
//  - _iter_slices: every slice has shape[0] / n rows, the first shape[0] % n one more.
//  - GreedyLoadBalancingStrategy (tf.contrib.training, gone in TF 2) takes numpy's argmin of the
//    loads (ties: lowest index) and then adds the op's load. contrib's byte_size_load_fn measures
//    op.outputs[0]; for a VarHandleOp that is a scalar resource handle of size 0 in TF 2.21, so
//    with resource variables it would put everything on ps 0. libmwms loads the variable's bytes
//    (what the function measures for VariableV2, and what it is meant to measure).
// Deliberate differences (caller bugs TF lets through): partitioners with num_shards,
// max_partitions or min_slice_size < 1 are rejected when built; so are an empty name and a
// variable named like another's slice ("a/part_0" beside a partitioned "a": TF raises only when
// "a" comes first).

namespace {

[[noreturn]] void invalid(const std::string& message) { throw InvalidArgument(message); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// a * b, or an InvalidArgument naming `shape` when it overflows; a, b >= 0.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::vector<std::int64_t>& shape) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    invalid("variable shape " + shape_text(shape) + " has more elements or bytes than int64");
  }
  return out;
}

// Elements of `shape` (1 for a scalar). @throws InvalidArgument for a negative dim or overflow.
std::int64_t num_elements(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) {
      invalid("variable shape " + shape_text(shape) + " has negative dimension " +
              std::to_string(d) + " (TF: \"Dimension " + std::to_string(d) + " must be >= 0\")");
    }
  }
  for (std::int64_t d : shape) n = checked_mul(n, d, shape);
  return n;
}

}  // namespace

Partitioner Partitioner::fixed_size(int num_shards) {
  if (num_shards < 1) {
    invalid("fixed_size partitioner: num_shards " + std::to_string(num_shards) +
            " must be at least 1");
  }
  Partitioner p;
  p.kind_ = Kind::kFixedSize;
  p.limit_ = num_shards;
  return p;
}

Partitioner Partitioner::min_max(int max_partitions, std::int64_t min_slice_size) {
  if (max_partitions < 1) {
    invalid("min_max partitioner: max_partitions " + std::to_string(max_partitions) +
            " must be at least 1");
  }
  if (min_slice_size < 1) {
    invalid("min_max partitioner: min_slice_size " + std::to_string(min_slice_size) +
            " bytes must be at least 1");
  }
  Partitioner p;
  p.kind_ = Kind::kMinMax;
  p.limit_ = max_partitions;
  p.min_slice_size_ = min_slice_size;
  return p;
}

bool Partitioner::is_partitioned(const std::vector<std::int64_t>& shape) const noexcept {
  return kind_ != Kind::kNone && !shape.empty();
}

int Partitioner::num_partitions(const std::vector<std::int64_t>& shape, DataType dtype) const {
  const std::int64_t elements = num_elements(shape);
  if (!is_partitioned(shape)) return 1;
  const std::int64_t rows = shape[0];
  std::int64_t n = 0;
  if (kind_ == Kind::kFixedSize) {
    n = std::min<std::int64_t>(limit_, rows);
    if (n < 1) {
      invalid(describe() + " makes zero partitions of shape " + shape_text(shape) +
              " (TF: \"Partitioner returned zero partitions\")");
    }
  } else {
    const std::int64_t bytes =
        checked_mul(elements, static_cast<std::int64_t>(dtype_size(dtype)), shape);
    const std::int64_t wanted = bytes / min_slice_size_ + (bytes % min_slice_size_ != 0 ? 1 : 0);
    n = std::max<std::int64_t>(1, std::min<std::int64_t>({rows, limit_, wanted}));
  }
  for (std::int64_t d : shape) {
    if (d == 0) {
      invalid("cannot partition variable of shape " + shape_text(shape) +
              " with a zero dimension (TF: \"Expected 0 <= offset < shape\")");
    }
  }
  return static_cast<int>(n);
}

std::string Partitioner::describe() const {
  switch (kind_) {
    case Kind::kFixedSize:
      return "fixed_size(" + std::to_string(limit_) + ")";
    case Kind::kMinMax:
      return "min_max(" + std::to_string(limit_) + ", " + std::to_string(min_slice_size_) + ")";
    case Kind::kNone:
      break;
  }
  return "none";
}

std::string_view to_string(PsPlacement placement) noexcept {
  return placement == PsPlacement::kGreedyByBytes ? "greedy" : "round_robin";
}

PsPlacement parse_ps_placement(std::string_view name) {
  if (name == "round_robin") return PsPlacement::kRoundRobin;
  if (name == "greedy") return PsPlacement::kGreedyByBytes;
  invalid("unknown ps placement \"" + std::string(name) +
          "\" (expected \"round_robin\" or \"greedy\")");
}

namespace {

// The slices of variable `index` in order, ps_task still unset (TF's _iter_slices).
void append_slices(const VariableSpec& spec, int index, const Partitioner& partitioner,
                   std::vector<VariableShard>& out) {
  const int n = partitioner.num_partitions(spec.shape, spec.dtype);  // validates the shape
  const bool partitioned = partitioner.is_partitioned(spec.shape);
  const std::int64_t dim0 = spec.shape.empty() ? 1 : spec.shape[0];  // a scalar is one row
  std::int64_t row_elements = 1;
  for (std::size_t d = 1; d < spec.shape.size(); ++d) {
    row_elements = checked_mul(row_elements, spec.shape[d], spec.shape);
  }
  std::int64_t row = 0;
  for (int k = 0; k < n; ++k) {
    VariableShard s;
    s.variable = index;
    s.shard = k;
    s.num_shards = n;
    s.partitioned = partitioned;
    s.row_offset = row;
    s.rows = dim0 / n + (k < dim0 % n ? 1 : 0);
    s.element_offset = static_cast<std::size_t>(row * row_elements);
    s.count = static_cast<std::size_t>(s.rows * row_elements);
    s.name = partitioned ? spec.name + "/part_" + std::to_string(k) : spec.name;
    row += s.rows;
    out.push_back(std::move(s));
  }
}

}  // namespace

std::vector<VariableShard> place_variables(const std::vector<VariableSpec>& variables, int num_ps,
                                           PsPlacement placement, const Partitioner& partitioner) {
  if (num_ps < 1) invalid("place_variables: num_ps " + std::to_string(num_ps) + " must be >= 1");
  if (variables.size() > static_cast<std::size_t>(INT_MAX)) {
    invalid("place_variables: " + std::to_string(variables.size()) + " variables are too many");
  }
  std::vector<VariableShard> shards;
  std::set<std::string> names;
  for (const VariableSpec& spec : variables) {
    if (spec.name.empty()) invalid("place_variables: a variable has an empty name");
    if (!names.insert(spec.name).second) {
      invalid("place_variables: variable \"" + spec.name + "\" is declared twice");
    }
  }
  for (std::size_t i = 0; i < variables.size(); ++i) {
    const std::size_t first = shards.size();
    append_slices(variables[i], static_cast<int>(i), partitioner, shards);
    for (std::size_t k = first; k < shards.size(); ++k) {
      if (shards[k].partitioned && names.count(shards[k].name) != 0) {
        invalid("place_variables: slice \"" + shards[k].name + "\" of variable \"" +
                variables[i].name + "\" has the name of another variable (TF: \"already exists\")");
      }
    }
  }
  std::vector<std::size_t> loads(static_cast<std::size_t>(num_ps), 0);
  for (std::size_t k = 0; k < shards.size(); ++k) {
    VariableShard& s = shards[k];
    if (placement == PsPlacement::kRoundRobin) {
      s.ps_task = static_cast<int>(k % static_cast<std::size_t>(num_ps));
    } else {
      std::size_t best = 0;
      for (std::size_t t = 1; t < loads.size(); ++t) {
        if (loads[t] < loads[best]) best = t;
      }
      s.ps_task = static_cast<int>(best);
      loads[best] += s.count * dtype_size(variables[static_cast<std::size_t>(s.variable)].dtype);
    }
  }
  return shards;
}

std::vector<std::size_t> bytes_per_ps(const std::vector<VariableShard>& shards,
                                      const std::vector<VariableSpec>& variables, int num_ps) {
  if (num_ps < 1) invalid("bytes_per_ps: num_ps " + std::to_string(num_ps) + " must be >= 1");
  std::vector<std::size_t> bytes(static_cast<std::size_t>(num_ps), 0);
  for (const VariableShard& s : shards) {
    if (s.variable < 0 || static_cast<std::size_t>(s.variable) >= variables.size()) {
      invalid("bytes_per_ps: shard \"" + s.name + "\" names variable " +
              std::to_string(s.variable) + " of " + std::to_string(variables.size()));
    }
    if (s.ps_task < 0 || s.ps_task >= num_ps) {
      invalid("bytes_per_ps: shard \"" + s.name + "\" is on ps task " + std::to_string(s.ps_task) +
              ", not in 0.." + std::to_string(num_ps - 1));
    }
    bytes[static_cast<std::size_t>(s.ps_task)] +=
        s.count * dtype_size(variables[static_cast<std::size_t>(s.variable)].dtype);
  }
  return bytes;
}

}  // namespace mwms
