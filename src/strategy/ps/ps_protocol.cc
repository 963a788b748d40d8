#include "strategy/ps/ps_protocol.h"

#include <cmath>
#include <cstring>

namespace mwms::strategy::ps {

namespace {

constexpr std::size_t kMaxNameBytes = 1024;
constexpr std::size_t kMaxShards = std::size_t{1} << 20;
constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 40;

class Writer {
 public:
  template <class T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
    out_.append(b, sizeof(T));
  }
  void put_string(const std::string& s) {
    put(static_cast<std::uint16_t>(s.size()));
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Every read is checked against what is left; a failure names the field.
class Reader {
 public:
  Reader(const char* data, std::size_t bytes, const ErrorContext& ctx)
      : p_(data), left_(bytes), ctx_(ctx) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return v;
  }
  std::string get_string(const char* field) {
    const std::size_t n = get<std::uint16_t>(field);
    if (n > kMaxNameBytes) bad(std::string(field) + " is " + std::to_string(n) + " bytes long");
    need(n, field);
    std::string s(p_, n);
    p_ += n;
    left_ -= n;
    return s;
  }
  std::size_t left() const { return left_; }
  [[noreturn]] void bad(const std::string& why) const {
    throw PeerError("malformed parameter-server description: " + why, ctx_);
  }

 private:
  void need(std::size_t n, const char* field) const {
    if (n > left_) {
      bad(std::string("truncated at ") + field + " (" + std::to_string(left_) +
          " bytes left, " + std::to_string(n) + " needed)");
    }
  }
  const char* p_;
  std::size_t left_;
  const ErrorContext& ctx_;
};

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

}  // namespace

const char* kind_name(PsKind kind) noexcept {
  switch (kind) {
    case PsKind::kInit: return "init";
    case PsKind::kJoin: return "join";
    case PsKind::kReady: return "ready";
    case PsKind::kPush: return "push";
    case PsKind::kPull: return "pull";
    case PsKind::kValues: return "values";
    case PsKind::kData: return "data";
    case PsKind::kBye: return "goodbye";
    case PsKind::kRefused: return "refused";
    case PsKind::kSave: return "save";
    case PsKind::kSaved: return "saved";
    case PsKind::kRestore: return "restore";
    case PsKind::kFailed: return "failed";
    case PsKind::kSharedValues: return "shared values";
    case PsKind::kCopied: return "copied";
  }
  return "?";
}

bool is_ps_kind(std::uint8_t kind) noexcept {
  return kind >= static_cast<std::uint8_t>(PsKind::kInit) &&
         kind <= static_cast<std::uint8_t>(PsKind::kCopied);
}

std::string encode_saved(const ShardFileStamp& stamp) {
  Writer w;
  w.put(stamp.version);
  w.put(stamp.file_bytes);
  w.put(stamp.file_crc32);
  return w.take();
}

ShardFileStamp decode_saved(const char* data, std::size_t bytes, const ErrorContext& ctx) {
  if (bytes != kSavedBytes) {
    throw PeerError("a saved reply of " + std::to_string(bytes) + " bytes (" +
                    std::to_string(kSavedBytes) + " expected)", ctx);
  }
  Reader r(data, bytes, ctx);
  ShardFileStamp s;
  s.version = r.get<std::uint64_t>("version");
  s.file_bytes = r.get<std::uint64_t>("file bytes");
  s.file_crc32 = r.get<std::uint32_t>("file crc32");
  return s;
}

std::string encode_restore(const RestoreRequest& q) {
  Writer w;
  w.put(static_cast<std::uint32_t>(q.description.size()));
  std::string out = w.take();
  out += q.description;
  out += encode_saved(q.expected);
  Writer d;
  d.put(static_cast<std::uint16_t>(q.directory.size()));
  out += d.take();
  out += q.directory;
  return out;
}

RestoreRequest decode_restore(const char* data, std::size_t bytes, const ErrorContext& ctx) {
  Reader r(data, bytes, ctx);
  RestoreRequest q;
  const std::uint32_t n = r.get<std::uint32_t>("description bytes");
  if (n > kMaxDescriptionBytes || n > r.left()) {
    r.bad("a restore request's description of " + std::to_string(n) + " bytes (" +
          std::to_string(r.left()) + " left)");
  }
  const char* p = data + sizeof(std::uint32_t);
  q.description.assign(p, n);
  if (r.left() - n < kSavedBytes + sizeof(std::uint16_t)) {
    r.bad("a restore request truncated after its description");
  }
  q.expected = decode_saved(p + n, kSavedBytes, ctx);
  Reader tail(p + n + kSavedBytes, r.left() - n - kSavedBytes, ctx);
  const std::uint16_t dir = tail.get<std::uint16_t>("directory bytes");
  if (dir > kMaxDirectoryBytes || dir != tail.left()) {
    tail.bad("a restore request's directory of " + std::to_string(dir) + " bytes (" +
             std::to_string(tail.left()) + " left)");
  }
  q.directory.assign(p + n + kSavedBytes + sizeof(std::uint16_t), dir);
  return q;
}

std::string encode(const JobDescription& d) {
  Writer w;
  w.put(kDescriptionMagic);
  w.put(kDescriptionVersion);
  w.put(d.sync_replicas);
  w.put(d.replicas_to_aggregate);
  w.put(d.total_num_replicas);
  w.put(d.max_staleness);
  w.put(d.optimizer);
  w.put(d.learning_rate);
  w.put(d.momentum);
  w.put(d.use_nesterov);
  w.put(d.beta1);
  w.put(d.beta2);
  w.put(d.epsilon);
  w.put(d.num_workers);
  w.put(d.num_ps);
  w.put(static_cast<std::uint32_t>(d.shards.size()));
  for (const ShardDescription& s : d.shards) {
    w.put_string(s.name);
    w.put(s.variable);
    w.put(s.shard);
    w.put(s.element_offset);
    w.put(s.count);
  }
  return w.take();
}

JobDescription decode(const char* data, std::size_t bytes, const ErrorContext& ctx) {
  Reader r(data, bytes, ctx);
  if (bytes > kMaxDescriptionBytes) r.bad(std::to_string(bytes) + " bytes (at most " +
                                          std::to_string(kMaxDescriptionBytes) + ")");
  if (r.get<std::uint32_t>("magic") != kDescriptionMagic) r.bad("bad magic");
  const auto version = r.get<std::uint16_t>("version");
  if (version != kDescriptionVersion) {
    r.bad("version " + std::to_string(version) + " (this build speaks " +
          std::to_string(kDescriptionVersion) + ")");
  }
  JobDescription d;
  d.sync_replicas = r.get<std::uint8_t>("sync_replicas");
  d.replicas_to_aggregate = r.get<std::int32_t>("replicas_to_aggregate");
  d.total_num_replicas = r.get<std::int32_t>("total_num_replicas");
  d.max_staleness = r.get<std::int32_t>("max_staleness");
  d.optimizer = r.get<std::uint8_t>("optimizer");
  d.learning_rate = r.get<double>("learning_rate");
  d.momentum = r.get<double>("momentum");
  d.use_nesterov = r.get<std::uint8_t>("use_nesterov");
  d.beta1 = r.get<double>("beta1");
  d.beta2 = r.get<double>("beta2");
  d.epsilon = r.get<double>("epsilon");
  d.num_workers = r.get<std::int32_t>("num_workers");
  d.num_ps = r.get<std::int32_t>("num_ps");
  if (d.sync_replicas > 1 || d.use_nesterov > 1) r.bad("a flag is neither 0 nor 1");
  if (d.optimizer > 2) r.bad("unknown optimizer " + std::to_string(d.optimizer));
  if (d.num_workers < 1 || d.num_workers > 4096 || d.num_ps < 1 || d.num_ps > 4096) {
    r.bad("num_workers " + std::to_string(d.num_workers) + ", num_ps " +
          std::to_string(d.num_ps));
  }
  if (d.replicas_to_aggregate < 1 || d.replicas_to_aggregate > d.total_num_replicas ||
      d.total_num_replicas > d.num_workers) {
    r.bad("replicas_to_aggregate " + std::to_string(d.replicas_to_aggregate) +
          " / total_num_replicas " + std::to_string(d.total_num_replicas));
  }
  for (double v : {d.learning_rate, d.momentum, d.beta1, d.beta2, d.epsilon}) {
    if (!std::isfinite(v)) r.bad("an optimizer option is not finite");
  }
  const std::uint32_t n = r.get<std::uint32_t>("shard count");
  // Each shard takes at least 26 bytes: a count that the rest cannot hold is refused before
  // anything is reserved for it.
  if (n > kMaxShards || static_cast<std::size_t>(n) * 26 > r.left()) {
    r.bad(std::to_string(n) + " shards in " + std::to_string(r.left()) + " bytes");
  }
  d.shards.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    ShardDescription s;
    s.name = r.get_string("shard name");
    s.variable = r.get<std::uint32_t>("shard variable");
    s.shard = r.get<std::uint32_t>("shard index");
    s.element_offset = r.get<std::uint64_t>("shard offset");
    s.count = r.get<std::uint64_t>("shard count");
    if (s.count > kMaxCount || s.element_offset > kMaxCount) {
      r.bad("shard " + std::to_string(i) + " has " + std::to_string(s.count) +
            " elements at offset " + std::to_string(s.element_offset));
    }
    d.shards.push_back(std::move(s));
  }
  if (r.left() != 0) r.bad(std::to_string(r.left()) + " bytes after the last shard");
  return d;
}

std::string first_difference(const JobDescription& c, const JobDescription& w) {
  auto diff = [](const char* field, const std::string& a, const std::string& b) {
    return std::string(field) + ": the chief's " + a + ", this worker's " + b;
  };
  if (c.sync_replicas != w.sync_replicas) {
    return diff("mode", c.sync_replicas ? "sync" : "async", w.sync_replicas ? "sync" : "async");
  }
  if (c.replicas_to_aggregate != w.replicas_to_aggregate) {
    return diff("replicas_to_aggregate", std::to_string(c.replicas_to_aggregate),
                std::to_string(w.replicas_to_aggregate));
  }
  if (c.total_num_replicas != w.total_num_replicas) {
    return diff("total_num_replicas", std::to_string(c.total_num_replicas),
                std::to_string(w.total_num_replicas));
  }
  if (c.max_staleness != w.max_staleness) {
    return diff("max_staleness", std::to_string(c.max_staleness),
                std::to_string(w.max_staleness));
  }
  if (c.optimizer != w.optimizer) {
    return diff("optimizer", std::to_string(c.optimizer), std::to_string(w.optimizer));
  }
  const double a[] = {c.learning_rate, c.momentum, c.beta1, c.beta2, c.epsilon};
  const double b[] = {w.learning_rate, w.momentum, w.beta1, w.beta2, w.epsilon};
  const char* names[] = {"learning_rate", "momentum", "beta1", "beta2", "epsilon"};
  for (int i = 0; i < 5; ++i) {
    if (a[i] != b[i]) return diff(names[i], num(a[i]), num(b[i]));
  }
  if (c.use_nesterov != w.use_nesterov) return diff("use_nesterov", "other", "other");
  if (c.num_workers != w.num_workers || c.num_ps != w.num_ps) {
    return diff("cluster", std::to_string(c.num_workers) + " workers, " +
                               std::to_string(c.num_ps) + " ps",
                std::to_string(w.num_workers) + " workers, " + std::to_string(w.num_ps) + " ps");
  }
  if (c.shards.size() != w.shards.size()) {
    return diff("shards on this ps", std::to_string(c.shards.size()),
                std::to_string(w.shards.size()));
  }
  for (std::size_t i = 0; i < c.shards.size(); ++i) {
    const ShardDescription& x = c.shards[i];
    const ShardDescription& y = w.shards[i];
    if (x == y) continue;
    auto text = [](const ShardDescription& s) {
      return s.name + " (" + std::to_string(s.count) + " elements at " +
             std::to_string(s.element_offset) + ")";
    };
    return diff(("shard " + std::to_string(i)).c_str(), text(x), text(y));
  }
  return {};
}

Layout ps_layout(const std::vector<ShardDescription>& shards) {
  Layout l;
  l.shard_offset.assign(shards.size(), 0);
  Segment pack;
  pack.pack = true;
  std::size_t at = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].count * sizeof(float) >= kSmallShardBytes) continue;
    l.shard_offset[i] = at;
    at += shards[i].count;
  }
  pack.count = at;
  if (pack.count > 0) l.segments.push_back(pack);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].count * sizeof(float) < kSmallShardBytes) continue;
    l.shard_offset[i] = at;
    Segment s;
    s.first_shard = i;
    s.last_shard = i + 1;
    s.element_offset = at;
    s.count = shards[i].count;
    l.segments.push_back(s);
    at += shards[i].count;
  }
  l.total = at;
  return l;
}

collective::FrameHeader envelope(PsKind kind, std::uint64_t seq, std::uint64_t count,
                                 std::int32_t root) {
  collective::FrameHeader h;
  h.kind = static_cast<std::uint8_t>(kind);
  h.seq = seq;
  h.count = count;
  h.root = root;
  return h;
}

collective::FrameHeader segment_header(const Layout& layout, std::size_t index,
                                       std::uint64_t seq) {
  collective::FrameHeader h = envelope(PsKind::kData, seq, layout.segments[index].count,
                                       static_cast<std::int32_t>(index));
  h.dtype = static_cast<std::uint8_t>(DataType::kFloat32);
  h.payload_bytes = layout.segments[index].count * sizeof(float);
  return h;
}

void check_segment(const collective::FrameHeader& got, const Layout& layout, std::size_t index,
                   std::uint64_t seq, const ErrorContext& ctx) {
  const collective::FrameHeader want = segment_header(layout, index, seq);
  if (std::memcmp(&want, &got, sizeof want) == 0) return;
  std::string what = "segment " + std::to_string(index) + " (" +
                     std::to_string(layout.segments[index].count) + " float32, version " +
                     std::to_string(seq) + ")";
  std::string seen = is_ps_kind(got.kind)
                         ? std::string(kind_name(static_cast<PsKind>(got.kind))) + " root " +
                               std::to_string(got.root) + ", count " +
                               std::to_string(got.count) + ", dtype " +
                               std::to_string(got.dtype) + ", version " + std::to_string(got.seq)
                         : "a message of kind " + std::to_string(got.kind);
  throw CollectiveMismatchError("parameter-server message mismatch: expected " + what +
                                    ", got " + seen +
                                    " (the two tasks hold different variables or layouts)",
                                ctx);
}

}  // namespace mwms::strategy::ps
