#include "sender.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "bodies.hpp"
#include "sync_bodies.hpp"
#include "fs_ops.hpp"
#include "node.hpp"
#include "plan_parts.hpp"
#include "receiver.hpp"
#include "scan_cache.hpp"
#include "util.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

void RecentManifests::remember(const Hash128& digest, std::shared_ptr<const MappedManifest> m) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = recent_.begin(); it != recent_.end(); ++it)
    if (it->first == digest) {
      recent_.erase(it);
      break;
    }
  const size_t budget = std::max(entry_budget_, 2 * static_cast<size_t>(m->count()));
  recent_.emplace_front(digest, std::move(m));
  size_t total = 0;
  for (auto& kv : recent_) total += kv.second->count();
  while (recent_.size() > max_count_ || (recent_.size() > 1 && total > budget)) {
    total -= recent_.back().second->count();
    recent_.pop_back();
  }
}

std::shared_ptr<const MappedManifest> RecentManifests::find(const Hash128& digest) const {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [d, m] : recent_)
    if (d == digest) return m;
  return nullptr;
}

size_t RecentManifests::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return recent_.size();
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RecentManifests g_recent(8, 500000);  // this process's scans (sender.hpp)

std::shared_ptr<const MappedManifest> recent_manifest(const std::string& digest_hex) {
  Hash128 d;
  return Hash128::from_hex(digest_hex, d) ? g_recent.find(d) : nullptr;
}

// A data message's pieces travel in its header (about 30 bytes each): a batch of many small
// files ends at this many, far below the header limit and a short step for the host.
constexpr size_t kMaxPiecesPerBatch = 4096;
constexpr int64_t kStepMsPerEntry = 1;  // a host's time per manifest entry in a plan or commit, at most
struct Step {
  std::shared_ptr<Call> call;
  std::vector<size_t> hosts;  // index into the host list, per call target
};

class Pusher {
 public:
  Pusher(Node& node, const std::vector<PushHost>& hosts, const PushOptions& opts,
         const std::function<void()>& check_interrupt)
      : node_(node), hosts_(hosts), opts_(opts), check_(check_interrupt) {}

  Step send(const std::vector<size_t>& targets, const SyncStepBody& body, std::vector<zmq::message_t> frames) {
    std::vector<Target> t;
    for (size_t h : targets) t.push_back({hosts_[h].addr, ""});
    Header tmpl;
    tmpl.kind = Kind::Sync;
    tmpl.body = body;
    return {node_.call(t, std::move(tmpl), std::move(frames), true), targets};
  }

  // Waits for every answer; throws naming the hosts that failed. Results by host index.
  // entries: how many manifest entries the step works through on the host (a plan or a commit
  // of a million files takes the agent minutes): each adds kStepMsPerEntry to the wait, so a
  // large tree that commits is never reported failed (an agent that dies fails the call at once).
  std::map<size_t, CallResult> wait(Step& s, const std::string& what, size_t entries = 0) {
    const int64_t limit_ms = opts_.step_timeout_ms + static_cast<int64_t>(entries) * kStepMsPerEntry;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
    while (!s.call->wait_done(100)) {
      check_();
      if (std::chrono::steady_clock::now() > deadline) {
        std::string who;
        for (int64_t i : s.call->missing()) who += (who.empty() ? "" : ", ") + hosts_[s.hosts[i]].label;
        node_.forget_call(s.call->id());
        throw std::runtime_error("workspace sync: " + who + " did not answer the " + what + " step within " +
                                 std::to_string(limit_ms / 1000) + " s");
      }
    }
    node_.forget_call(s.call->id());
    std::map<size_t, CallResult> out;
    std::string errors;
    for (auto& r : s.call->take()) {
      size_t h = s.hosts[static_cast<size_t>(r.index)];
      if (!r.ok) {
        std::string text = r.body.is_object() ? r.body.value("text", std::string("failed")) : "failed";
        errors += (errors.empty() ? "" : "; ") + hosts_[h].label + ": " + text;
      }
      out[h] = std::move(r);
    }
    if (!errors.empty()) throw std::runtime_error("workspace sync failed on " + errors);
    return out;
  }

 private:
  Node& node_;
  const std::vector<PushHost>& hosts_;
  const PushOptions& opts_;
  const std::function<void()>& check_;
};

zmq::message_t frame_of(const std::string& s) { return zmq::message_t(s.data(), s.size()); }

}  // namespace

namespace {
// An XXH3-128 streaming state, freed when it goes.
struct HashState {
  XXH3_state_t* st = XXH3_createState();
  HashState() { XXH3_128bits_reset(st); }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
  ~HashState() { XXH3_freeState(st); }
  void update(const void* data, size_t n) { XXH3_128bits_update(st, data, n); }
  Hash128 digest() const {
    XXH128_hash_t h = XXH3_128bits_digest(st);
    return Hash128{h.low64, h.high64};
  }
};

// A zstd compression context, freed when it goes.
struct Compressor {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  ~Compressor() { ZSTD_freeCCtx(c); }
};

// How many paths of each kind a report names: its counts are whole, its lists stop here (the
// host sends no more), so a sync of a million files reports in kilobytes (.py paths are all
// kept: auto_reload needs each).
constexpr size_t kReportPaths = SyncReceiver::kReportPaths;

// The paths of a NUL-separated frame (a host's commit answer).
json nul_separated(const zmq::message_t& frame) {
  json out = json::array();
  const char* p = static_cast<const char*>(frame.data());
  const char* end = p + frame.size();
  while (p < end) {
    const char* nul = static_cast<const char*>(std::memchr(p, '\0', static_cast<size_t>(end - p)));
    if (!nul) nul = end;
    out.push_back(std::string(p, static_cast<size_t>(nul - p)));
    p = nul + 1;
  }
  return out;
}

// What the report says of the content that travelled: how many files, the bytes per top-level
// directory, the first kReportPaths files in path order and the kReportPaths largest; bounded
// whatever the tree (a bit per manifest entry, paths only for the rows kept). A file sent to
// two groups of hosts counts once.
class SentFiles {
 public:
  explicit SentFiles(uint64_t entries) : seen_(static_cast<size_t>(entries)) {}

  // e is the manifest's entry number `ordinal`.
  void add(const Entry& e, uint64_t ordinal, uint64_t stored) {
    if (ordinal >= seen_.size() || seen_[ordinal]) return;
    seen_[ordinal] = true;
    ++files_;
    const size_t slash = e.path.find('/');
    dirs_[slash == std::string::npos ? "./" : e.path.substr(0, slash + 1)] += e.size;
    const Row r{ordinal, e.path, e.size, stored};
    keep(first_, r, [](const Row& a, const Row& b) { return a.ordinal < b.ordinal; });
    keep(largest_, r, [](const Row& a, const Row& b) { return a.size > b.size; });
  }

  // {files, dirs: [[top, bytes]], first: [[path, size, stored]] in path order, largest: the same
  // largest first}.
  json to_json() {
    std::sort(first_.begin(), first_.end(), [](const Row& a, const Row& b) { return a.ordinal < b.ordinal; });
    std::sort(largest_.begin(), largest_.end(), [](const Row& a, const Row& b) { return a.size > b.size; });
    auto rows = [](const std::vector<Row>& v) {
      json out = json::array();
      for (auto& r : v) out.push_back({r.path, r.size, r.stored});
      return out;
    };
    json dirs = json::array();
    for (auto& [d, n] : dirs_) dirs.push_back({d, n});
    return {{"files", files_}, {"dirs", dirs}, {"first", rows(first_)}, {"largest", rows(largest_)}};
  }

 private:
  struct Row {
    uint64_t ordinal;
    std::string path;
    uint64_t size, stored;
  };
  // Keeps the kReportPaths rows that come first by `before`: a heap whose top is the last kept.
  template <typename Before>
  static void keep(std::vector<Row>& heap, const Row& r, Before before) {
    if (heap.size() == kReportPaths) {
      if (!before(r, heap.front())) return;
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = r;
    } else {
      heap.push_back(r);
    }
    std::push_heap(heap.begin(), heap.end(), before);
  }

  std::vector<bool> seen_;
  uint64_t files_ = 0;
  std::map<std::string, uint64_t> dirs_;
  std::vector<Row> first_, largest_;
};

// One push of a scanned tree to its hosts, in the four steps of the Sync protocol: begin (only
// the digest; equal hosts are done), plan (the manifest or a delta; each host answers with the
// content it lacks), data (one stream per group of hosts lacking the same content), commit
// (each host switches its staged files in, in one batch). A failure aborts the hosts' sessions.
class Push {
 public:
  Push(Node& node, const std::string& root, const std::vector<PushHost>& hosts, const PushOptions& opts,
       const std::function<void()>& check_interrupt, const ScanResult& scan)
      : node_(node), root_(root), hosts_(hosts), opts_(opts), check_(check_interrupt), p_(node, hosts, opts, check_),
        m_(scan.file), digest_(scan.digest), sid_(random_hex(16)), sent_(scan.file->count()) {
    for (auto& h : hosts) report_hosts_.push_back({{"addr", h.addr}, {"label", h.label}, {"bytes_sent", 0}});
  }

  void run() {
    try {
      begin();
      if (differ_.empty()) return;
      plan_and_send();
      commit();
    } catch (...) {
      abort();
      throw;
    }
  }
  const Hash128& digest() const { return digest_; }
  json take_hosts() { return std::move(report_hosts_); }
  json take_sent() { return sent_.to_json(); }

 private:
  SyncStepBody step(const char* op) const {
    SyncStepBody b;
    b.op = op;
    b.sid = sid_;
    return b;
  }

  // A host's answer to a step, typed; one that does not read fails the sync, naming the host.
  SyncReply read_reply(size_t h, const CallResult& r) const {
    std::string why;
    auto reply = read_as<SyncReply>(r.body, &why);
    if (!reply) throw std::runtime_error("workspace sync: " + hosts_[h].label + " answered with a malformed reply: " + why);
    return std::move(*reply);
  }

  void count_sent(const std::vector<size_t>& targets, uint64_t n) {
    for (size_t h : targets) report_hosts_[h]["bytes_sent"] = report_hosts_[h]["bytes_sent"].get<uint64_t>() + n;
  }

  // 1. begin: only the digest travels; equal hosts are done.
  void begin() {
    std::vector<size_t> all;
    for (size_t i = 0; i < hosts_.size(); ++i) all.push_back(i);
    SyncStepBody body = step("begin");
    body.dest = opts_.dest;
    body.digest = digest_.hex();
    body.for_alloc = opts_.space_for;  // the agent picks the space
    Step sent = p_.send(all, body, {});
    for (auto& [h, r] : p_.wait(sent, "begin")) {
      SyncReply reply = read_reply(h, r);
      bool same = reply.same.value_or(false);
      report_hosts_[h]["same"] = same;
      report_hosts_[h]["dir"] = reply.dir.value_or("");
      if (!same) {
        differ_.push_back(h);
        by_base_[reply.have.value_or("")].push_back(h);
      }
    }
  }

  // 2 and 3. plan and data, part by part: each part of the manifest (or of a delta against what
  //    a host holds) goes to the hosts planning from it; each answers with the content it lacks
  //    among the part's files, which goes to it (one stream per group of hosts lacking the same)
  //    before the next part. Neither side holds more than a part's plan at a time. A host whose
  //    copy turns out not to fit the delta plans again from the whole manifest.
  void plan_and_send() {
    std::vector<std::pair<std::shared_ptr<const MappedManifest>, std::vector<size_t>>> runs;  // base (null: whole), hosts
    std::vector<size_t> whole;
    for (auto& [have, targets] : by_base_) {
      std::shared_ptr<const MappedManifest> base = recent_manifest(have);
      if (base)
        runs.emplace_back(base, targets);
      else
        whole.insert(whole.end(), targets.begin(), targets.end());
    }
    if (!whole.empty()) runs.emplace_back(nullptr, whole);
    for (size_t i = 0; i < runs.size(); ++i) {  // a refit run is appended: this loop takes it too
      std::vector<size_t> refit = plan_run(runs[i].first, runs[i].second);
      if (!refit.empty()) runs.emplace_back(nullptr, refit);
    }
    while (!inflight_.empty()) {
      p_.wait(inflight_.front(), "data");
      inflight_.pop_front();
    }
  }

  // A plan to `targets`, part by part, with each part's data. Returns the hosts whose copy did
  // not fit the delta (they plan again from the whole manifest).
  std::vector<size_t> plan_run(const std::shared_ptr<const MappedManifest>& base, std::vector<size_t> targets) {
    PlanParts parts(m_, base);
    for (size_t h : targets) report_hosts_[h]["manifest"] = base ? "delta" : "whole";
    std::vector<size_t> refit;
    PlanPart part;
    for (size_t k = 0; !targets.empty() && parts.next(part); ++k) {
      SyncStepBody body = step("plan");
      body.part = k;
      body.last = part.last;
      if (base) {
        body.base = by_base_digest(targets.front());
        body.digest = digest_.hex();
      }
      std::vector<zmq::message_t> frames;
      size_t bytes = 0;
      for (auto& f : part.frames) {
        frames.push_back(frame_of(f));
        bytes += f.size();
      }
      count_sent(targets, bytes);
      Step sent = p_.send(targets, body, std::move(frames));
      std::map<std::string, std::vector<size_t>> groups;  // need list -> hosts
      std::vector<size_t> going_on;
      for (auto& [h, r] : p_.wait(sent, "plan", part.entries)) {
        if (read_reply(h, r).full.value_or(false)) {
          refit.push_back(h);
          continue;
        }
        going_on.push_back(h);
        groups[r.frames.empty() ? std::string() : r.frames[0].to_string()].push_back(h);
      }
      targets = std::move(going_on);
      for (auto& [need, hosts] : groups) send_need(part, k, need, hosts);
    }
    return refit;
  }

  std::string by_base_digest(size_t h) const {
    for (auto& [have, hosts] : by_base_)
      if (std::find(hosts.begin(), hosts.end(), h) != hosts.end()) return have;
    return "";
  }

  // The content one group of hosts asked for in plan part k, streamed in batches of batch_bytes
  // (or kMaxPiecesPerBatch pieces), at most `window` data messages in flight.
  void send_need(const PlanPart& part, size_t k, const std::string& need, const std::vector<size_t>& hosts) {
    if (need.empty()) return;
    Stream st;
    st.targets = hosts;
    st.part = k;
    st.compress = opts_.compress == "always";
    if (opts_.compress == "auto")
      for (size_t h : hosts) st.compress = st.compress || hosts_[h].addr.rfind("ipc://", 0) != 0;
    for (size_t idx = 0; idx * 16 < need.size(); ++idx) {
      Hash128 hsh;
      std::memcpy(&hsh.lo, need.data() + idx * 16, 8);
      std::memcpy(&hsh.hi, need.data() + idx * 16 + 8, 8);
      auto it = std::lower_bound(part.files.begin(), part.files.end(), hsh,
                                 [](auto& a, const Hash128& key) { return a.hash < key; });
      if (it == part.files.end() || it->hash != hsh)
        throw std::runtime_error("a host asked for content this part of the workspace does not have");
      send_file(st, idx, *it);
      check_();
    }
    flush(st);
  }

  struct Stream {
    std::vector<size_t> targets;
    size_t part = 0;
    bool compress = false;
    std::vector<std::array<uint64_t, 5>> pieces;  // SyncStepBody::pieces
    std::string payload;
    size_t raw_in_batch = 0;
  };

  void flush(Stream& st) {
    if (st.pieces.empty()) return;
    count_sent(st.targets, st.payload.size());
    std::vector<zmq::message_t> f;
    f.push_back(frame_of(st.payload));
    SyncStepBody body = step("data");
    body.part = st.part;
    body.pieces = std::move(st.pieces);
    inflight_.push_back(p_.send(st.targets, body, std::move(f)));
    st.pieces.clear();
    st.payload.clear();
    st.raw_in_batch = 0;
    while (inflight_.size() >= static_cast<size_t>(opts_.window)) {
      p_.wait(inflight_.front(), "data");
      inflight_.pop_front();
    }
  }

  // One file's content into the stream, checked against its manifest hash as it is read.
  void send_file(Stream& st, size_t idx, const PlanPart::File& f) {
    const Entry& e = f.e;
    unique_fd fd(open((root_ + "/" + e.path).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) throw std::runtime_error("cannot read " + e.path + ": " + std::strerror(errno));
    HashState hash;
    if (buf_.empty()) {
      buf_.resize(opts_.batch_bytes);
      zbuf_.resize(ZSTD_compressBound(opts_.batch_bytes));
    }
    uint64_t off = 0, stored_total = 0;
    while (off < e.size) {
      size_t room = opts_.batch_bytes - st.raw_in_batch;
      if (room == 0 || st.pieces.size() >= kMaxPiecesPerBatch) {
        flush(st);
        room = opts_.batch_bytes;
      }
      size_t want = static_cast<size_t>(std::min<uint64_t>(room, e.size - off));
      ssize_t n = read(fd.get(), buf_.data(), want);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error(e.path + " changed while being sent (it is shorter now); sync again");
      hash.update(buf_.data(), static_cast<size_t>(n));
      const char* data = buf_.data();
      size_t stored = static_cast<size_t>(n);
      int z = 0;
      if (st.compress && n > 512) {
        size_t c = ZSTD_compressCCtx(zstd_.c, zbuf_.data(), zbuf_.size(), buf_.data(), static_cast<size_t>(n),
                                     opts_.zstd_level);
        if (!ZSTD_isError(c) && c < static_cast<size_t>(n) * 9 / 10) {
          data = zbuf_.data();
          stored = c;
          z = 1;
        }
      }
      st.pieces.push_back({static_cast<uint64_t>(idx), off, static_cast<uint64_t>(n), static_cast<uint64_t>(stored),
                           static_cast<uint64_t>(z)});
      st.payload.append(data, stored);
      st.raw_in_batch += static_cast<size_t>(n);
      stored_total += stored;
      off += static_cast<uint64_t>(n);
    }
    if (hash.digest() != e.hash) throw std::runtime_error(e.path + " changed while being sent; sync again");
    sent_.add(e, f.ordinal, stored_total);
  }

  // 4. commit: each host switches its staged files in, in one batch.
  void commit() {
    Step sent = p_.send(differ_, step("commit"), {});
    for (auto& [h, r] : p_.wait(sent, "commit", static_cast<size_t>(m_->count()))) {
      json counts = read_reply(h, r);  // named: items() must not outlive it
      for (auto& kv : counts.items()) report_hosts_[h][kv.key()] = kv.value();
      const char* kinds[] = {"added", "changed", "deleted"};
      for (size_t k = 0; k < 3; ++k) {  // NUL-separated paths, the first kReportPaths (receiver.cpp)
        json shown = k < r.frames.size() ? nul_separated(r.frames[k]) : json::array();
        const uint64_t total = counts.value(kinds[k], uint64_t(0));
        report_hosts_[h][std::string(kinds[k]) + "_more"] = total > shown.size() ? total - shown.size() : 0;
        report_hosts_[h][std::string(kinds[k]) + "_paths"] = std::move(shown);
      }
      report_hosts_[h]["py_paths"] = r.frames.size() > 3 ? nul_separated(r.frames[3]) : json::array();
    }
  }

  void abort() {
    if (differ_.empty()) return;
    try {
      Step sent = p_.send(differ_, step("abort"), {});
      sent.call->wait_done(2000);
      node_.forget_call(sent.call->id());
    } catch (...) {
    }
  }

  Node& node_;
  const std::string& root_;
  const std::vector<PushHost>& hosts_;
  const PushOptions& opts_;
  const std::function<void()>& check_;
  Pusher p_;
  std::shared_ptr<const MappedManifest> m_;
  Hash128 digest_;
  std::string sid_;
  json report_hosts_ = json::array();
  std::vector<size_t> differ_;
  std::map<std::string, std::vector<size_t>> by_base_;  // the host's manifest digest -> hosts
  std::deque<Step> inflight_;  // data messages not answered yet
  SentFiles sent_;
  Compressor zstd_;
  std::vector<char> buf_, zbuf_;
};

// The scan, refusing files over the size limit by name before anything is sent.
ScanResult scan_for_push(const std::string& root, const PushOptions& opts) {
  ScanResult scan = scan_cached(root, opts.cache_path, opts.scan, opts.incremental);
  if (scan.too_large.empty()) return scan;
  std::sort(scan.too_large.begin(), scan.too_large.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::string list;
  for (size_t i = 0; i < scan.too_large.size() && i < 10; ++i)
    list += (i ? ", " : "") + scan.too_large[i].first + " (" + format_bytes(scan.too_large[i].second) + ")";
  if (scan.too_large.size() > 10) list += " and " + std::to_string(scan.too_large.size() - 10) + " more";
  throw std::invalid_argument(std::to_string(scan.too_large.size()) + " file" +
                              (scan.too_large.size() == 1 ? " is" : "s are") + " over the size limit of " +
                              format_bytes(opts.scan.max_file_size) + ": " + list +
                              "; exclude them (exclude=[...] or .xmeshignore) or raise max_file_size");
}

json scan_report(const ScanResult& scan, double seconds) {
  json skipped = json::array();
  for (auto& s : scan.skipped) skipped.push_back({s.first, s.second});
  return {{"files", scan.files},
          {"dirs", scan.dirs},
          {"symlinks", scan.symlinks},
          {"bytes", scan.bytes},
          {"hashed_files", scan.hashed_files},
          {"hashed_bytes", scan.hashed_bytes},
          {"reused", scan.reused},
          {"incremental", scan.incremental},
          {"watched_dirs", scan.watched_dirs},
          {"skipped", skipped},
          {"seconds", seconds}};
}
}  // namespace

json push_workspace(Node& node, const std::string& root, const std::vector<PushHost>& hosts, const PushOptions& opts,
                    const std::function<void()>& check_interrupt) {
  auto t0 = std::chrono::steady_clock::now();
  ScanResult scan = scan_for_push(root, opts);
  double scan_s = seconds_since(t0);
  Push push(node, root, hosts, opts, check_interrupt, scan);
  g_recent.remember(scan.digest, scan.file);
  push.run();
  return {{"scan", scan_report(scan, scan_s)},
          {"digest", scan.digest.hex()},
          {"hosts", push.take_hosts()},
          {"sent", push.take_sent()},
          {"seconds", seconds_since(t0)}};
}

}  // namespace xmesh::ws
