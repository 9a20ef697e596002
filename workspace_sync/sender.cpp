#include "sender.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "diff.hpp"
#include "fs_ops.hpp"
#include "node.hpp"
#include "scan_cache.hpp"
#include "util.hpp"

namespace xmesh::ws {

using json = nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Manifests this process scanned lately, newest first: a host whose manifest is one of them
// (its digest answers `begin`) gets the plan as a delta against it.
constexpr size_t kRecentManifests = 8;
std::mutex g_recent_mu;
std::deque<std::pair<Hash128, std::shared_ptr<const Manifest>>> g_recent;

void remember_scanned(const Hash128& digest, std::shared_ptr<const Manifest> m) {
  std::lock_guard<std::mutex> g(g_recent_mu);
  for (auto it = g_recent.begin(); it != g_recent.end(); ++it)
    if (it->first == digest) {
      g_recent.erase(it);
      break;
    }
  g_recent.emplace_front(digest, std::move(m));
  if (g_recent.size() > kRecentManifests) g_recent.pop_back();
}

std::shared_ptr<const Manifest> recent_manifest(const std::string& digest_hex) {
  Hash128 d;
  if (!Hash128::from_hex(digest_hex, d)) return nullptr;
  std::lock_guard<std::mutex> g(g_recent_mu);
  for (auto& [digest, m] : g_recent)
    if (digest == d) return m;
  return nullptr;
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1u << 20))
    snprintf(buf, sizeof(buf), "%.1f MiB", n / 1048576.0);
  else if (n >= 1024)
    snprintf(buf, sizeof(buf), "%.1f KiB", n / 1024.0);
  else
    snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

struct Step {
  std::shared_ptr<Call> call;
  std::vector<size_t> hosts;  // index into the host list, per call target
};

class Pusher {
 public:
  Pusher(Node& node, const std::vector<PushHost>& hosts, const PushOptions& opts,
         const std::function<void()>& check_interrupt)
      : node_(node), hosts_(hosts), opts_(opts), check_(check_interrupt) {}

  Step send(const std::vector<size_t>& targets, json body, std::vector<zmq::message_t> frames) {
    std::vector<Target> t;
    for (size_t h : targets) t.push_back({hosts_[h].addr, ""});
    Header tmpl;
    tmpl.kind = Kind::Sync;
    tmpl.body = std::move(body);
    return {node_.call(t, std::move(tmpl), std::move(frames), true), targets};
  }

  // Waits for every answer; throws naming the hosts that failed. Results by host index.
  std::map<size_t, CallResult> wait(Step& s, const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.step_timeout_ms);
    while (!s.call->wait_done(100)) {
      check_();
      if (std::chrono::steady_clock::now() > deadline) {
        std::string who;
        for (int64_t i : s.call->missing()) who += (who.empty() ? "" : ", ") + hosts_[s.hosts[i]].label;
        node_.forget_call(s.call->id());
        throw std::runtime_error("workspace sync: " + who + " did not answer the " + what + " step within " +
                                 std::to_string(opts_.step_timeout_ms / 1000) + " s");
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

ScanResult scan_with_cache(const std::string& root, const PushOptions& opts) {
  ScanResult r;
  r.manifest = *scan_cached(root, opts.cache_path, opts.scan, opts.incremental, r);
  return r;
}

json push_workspace(Node& node, const std::string& root, const std::vector<PushHost>& hosts, const PushOptions& opts,
                    const std::function<void()>& check_interrupt) {
  auto t0 = std::chrono::steady_clock::now();
  ScanResult scan;
  std::shared_ptr<const Manifest> scanned = scan_cached(root, opts.cache_path, opts.scan, opts.incremental, scan);
  double scan_s = seconds_since(t0);
  if (!scan.too_large.empty()) {
    std::sort(scan.too_large.begin(), scan.too_large.end(), [](auto& a, auto& b) { return a.second > b.second; });
    std::string list;
    for (size_t i = 0; i < scan.too_large.size() && i < 10; ++i)
      list += (i ? ", " : "") + scan.too_large[i].first + " (" + human_bytes(scan.too_large[i].second) + ")";
    if (scan.too_large.size() > 10) list += " and " + std::to_string(scan.too_large.size() - 10) + " more";
    throw std::invalid_argument(std::to_string(scan.too_large.size()) + " file" +
                                (scan.too_large.size() == 1 ? " is" : "s are") + " over the size limit of " +
                                human_bytes(opts.scan.max_file_size) + ": " + list +
                                "; exclude them (exclude=[...] or .xmeshignore) or raise max_file_size");
  }
  const Manifest& m = *scanned;
  Hash128 digest = m.digest();
  remember_scanned(digest, scanned);
  std::string sid = random_hex(16);
  Pusher p(node, hosts, opts, check_interrupt);
  json report_hosts = json::array();
  for (auto& h : hosts) report_hosts.push_back({{"addr", h.addr}, {"label", h.label}, {"bytes_sent", 0}});
  std::vector<size_t> all;
  for (size_t i = 0; i < hosts.size(); ++i) all.push_back(i);

  std::vector<size_t> differ;
  json sent = json::array();
  auto count_sent = [&](const std::vector<size_t>& targets, uint64_t n) {
    for (size_t h : targets) report_hosts[h]["bytes_sent"] = report_hosts[h]["bytes_sent"].get<uint64_t>() + n;
  };
  try {
    // 1. begin: only the digest travels; equal hosts are done.
    json begin_body = {{"op", "begin"}, {"sid", sid}, {"dest", opts.dest}, {"digest", digest.hex()}};
    if (!opts.space_for.empty()) begin_body["for"] = opts.space_for;  // the agent picks the space
    Step begin = p.send(all, std::move(begin_body), {});
    std::map<std::string, std::vector<size_t>> by_base;  // the host's manifest digest -> hosts
    for (auto& [h, r] : p.wait(begin, "begin")) {
      report_hosts[h]["same"] = r.body.value("same", false);
      report_hosts[h]["dir"] = r.body.value("dir", std::string());
      if (!r.body.value("same", false)) {
        differ.push_back(h);
        by_base[r.body.value("have", std::string())].push_back(h);
      }
    }
    if (!differ.empty()) {
      // 2. plan: each host answers with the content it lacks. A host holding a manifest this
      //    process scanned gets only the entries that differ from it; the others (and a host
      //    whose copy turns out not to fit the delta) get the whole manifest.
      std::vector<Step> plans;
      std::vector<size_t> whole;
      for (auto& [have, targets] : by_base) {
        std::shared_ptr<const Manifest> base = recent_manifest(have);
        if (!base) {
          whole.insert(whole.end(), targets.begin(), targets.end());
          continue;
        }
        ManifestDelta delta = make_delta(*base, m);
        std::string up = delta.upserts.encode_wire(), del = delta.deleted.encode_wire();
        count_sent(targets, up.size() + del.size());
        for (size_t h : targets) report_hosts[h]["manifest"] = "delta";
        std::vector<zmq::message_t> f;
        f.push_back(frame_of(up));
        f.push_back(frame_of(del));
        plans.push_back(p.send(targets, {{"op", "plan"}, {"sid", sid}, {"base", have}, {"digest", digest.hex()}},
                               std::move(f)));
      }
      std::string wire;
      auto send_whole = [&](const std::vector<size_t>& targets) {
        if (wire.empty()) wire = m.encode_wire();
        count_sent(targets, wire.size());
        for (size_t h : targets) report_hosts[h]["manifest"] = "whole";
        std::vector<zmq::message_t> f;
        f.push_back(frame_of(wire));
        plans.push_back(p.send(targets, {{"op", "plan"}, {"sid", sid}}, std::move(f)));
      };
      if (!whole.empty()) send_whole(whole);
      std::map<std::string, std::vector<size_t>> groups;  // need list -> hosts
      for (size_t i = 0; i < plans.size(); ++i) {
        std::vector<size_t> refit;
        for (auto& [h, r] : p.wait(plans[i], "plan")) {
          if (r.body.value("full", false)) {
            refit.push_back(h);
            continue;
          }
          std::string need = r.frames.empty() ? std::string() : r.frames[0].to_string();
          groups[need].push_back(h);
        }
        if (!refit.empty()) send_whole(refit);  // appended: this loop waits for it too
      }
      std::unordered_map<Hash128, const Entry*, Hash128Hasher> local;
      for (auto& e : m.entries)
        if (e.type == EntryType::File) local.emplace(e.hash, &e);
      // 3. data: one stream per group of hosts lacking the same content.
      ZSTD_CCtx* cctx = ZSTD_createCCtx();
      struct FreeCtx {
        ZSTD_CCtx* c;
        ~FreeCtx() { ZSTD_freeCCtx(c); }
      } free_ctx{cctx};
      std::map<std::string, std::pair<uint64_t, uint64_t>> sent_by_path;  // raw, stored
      for (auto& [need, targets] : groups) {
        bool compress = opts.compress == "always";
        if (opts.compress == "auto")
          for (size_t h : targets) compress = compress || hosts[h].addr.rfind("ipc://", 0) != 0;
        std::deque<Step> inflight;
        json pieces = json::array();
        std::string payload;
        size_t raw_in_batch = 0;
        auto flush = [&]() {
          if (pieces.empty()) return;
          count_sent(targets, payload.size());
          std::vector<zmq::message_t> f;
          f.push_back(frame_of(payload));
          inflight.push_back(p.send(targets, {{"op", "data"}, {"sid", sid}, {"pieces", pieces}}, std::move(f)));
          pieces = json::array();
          payload.clear();
          raw_in_batch = 0;
          while (inflight.size() >= static_cast<size_t>(opts.window)) {
            p.wait(inflight.front(), "data");
            inflight.pop_front();
          }
        };
        std::vector<char> buf(opts.batch_bytes);
        std::vector<char> zbuf(ZSTD_compressBound(opts.batch_bytes));
        for (size_t idx = 0; idx * 16 < need.size(); ++idx) {
          Hash128 hsh;
          std::memcpy(&hsh.lo, need.data() + idx * 16, 8);
          std::memcpy(&hsh.hi, need.data() + idx * 16 + 8, 8);
          auto it = local.find(hsh);
          if (it == local.end()) throw std::runtime_error("a host asked for content this workspace does not have");
          const Entry& e = *it->second;
          int fd = open((root + "/" + e.path).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
          if (fd < 0) throw std::runtime_error("cannot read " + e.path + ": " + std::strerror(errno));
          XXH3_state_t* st = XXH3_createState();
          XXH3_128bits_reset(st);
          uint64_t off = 0;
          uint64_t stored_total = 0;
          try {
            while (off < e.size) {
              size_t room = opts.batch_bytes - raw_in_batch;
              if (room == 0) {
                flush();
                room = opts.batch_bytes;
              }
              size_t want = static_cast<size_t>(std::min<uint64_t>(room, e.size - off));
              ssize_t n = read(fd, buf.data(), want);
              if (n < 0 && errno == EINTR) continue;
              if (n <= 0)
                throw std::runtime_error(e.path + " changed while being sent (it is shorter now); sync again");
              XXH3_128bits_update(st, buf.data(), static_cast<size_t>(n));
              const char* data = buf.data();
              size_t stored = static_cast<size_t>(n);
              int z = 0;
              if (compress && n > 512) {
                size_t c = ZSTD_compressCCtx(cctx, zbuf.data(), zbuf.size(), buf.data(), static_cast<size_t>(n),
                                             opts.zstd_level);
                if (!ZSTD_isError(c) && c < static_cast<size_t>(n) * 9 / 10) {
                  data = zbuf.data();
                  stored = c;
                  z = 1;
                }
              }
              pieces.push_back({idx, off, n, stored, z});
              payload.append(data, stored);
              raw_in_batch += static_cast<size_t>(n);
              stored_total += stored;
              off += static_cast<uint64_t>(n);
            }
          } catch (...) {
            close(fd);
            XXH3_freeState(st);
            throw;
          }
          close(fd);
          XXH128_hash_t got = XXH3_128bits_digest(st);
          XXH3_freeState(st);
          if (Hash128{got.low64, got.high64} != e.hash)
            throw std::runtime_error(e.path + " changed while being sent; sync again");
          auto& s = sent_by_path[e.path];
          s.first = e.size;
          s.second = std::max(s.second, stored_total);
          check_interrupt();
        }
        flush();
        while (!inflight.empty()) {
          p.wait(inflight.front(), "data");
          inflight.pop_front();
        }
      }
      for (auto& [path, sizes] : sent_by_path) sent.push_back({path, sizes.first, sizes.second});
      // 4. commit: each host switches its staged files in, in one batch.
      Step commit = p.send(differ, {{"op", "commit"}, {"sid", sid}}, {});
      for (auto& [h, r] : p.wait(commit, "commit"))
        for (auto& kv : r.body.items()) report_hosts[h][kv.key()] = kv.value();
    }
  } catch (...) {
    if (!differ.empty()) {
      try {
        Step abort = p.send(differ, {{"op", "abort"}, {"sid", sid}}, {});
        abort.call->wait_done(2000);
        node.forget_call(abort.call->id());
      } catch (...) {
      }
    }
    throw;
  }
  size_t files = 0, dirs = 0, links = 0;
  for (auto& e : m.entries) {
    files += e.type == EntryType::File;
    dirs += e.type == EntryType::Dir;
    links += e.type == EntryType::Symlink;
  }
  json skipped = json::array();
  for (auto& s : scan.skipped) skipped.push_back({s.first, s.second});
  return {{"scan",
           {{"files", files},
            {"dirs", dirs},
            {"symlinks", links},
            {"bytes", m.file_bytes()},
            {"hashed_files", scan.hashed_files},
            {"hashed_bytes", scan.hashed_bytes},
            {"reused", scan.reused},
            {"incremental", scan.incremental},
            {"watched_dirs", scan.watched_dirs},
            {"skipped", skipped},
            {"seconds", scan_s}}},
          {"digest", digest.hex()},
          {"hosts", report_hosts},
          {"sent", sent},
          {"seconds", seconds_since(t0)}};
}

}  // namespace xmesh::ws
