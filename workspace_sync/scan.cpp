#include "scan.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <system_error>
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <atomic>
#include <thread>
#include <set>
#include <string_view>
#include <unordered_map>

#include "fs_ops.hpp"
#include "path_safety.hpp"
#include "scan_internal.hpp"
#include "util.hpp"

namespace xmesh::ws {

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

using detail::Listing;

// A rescan looked at more entries afresh than it may hold: it becomes a whole scan.
struct TooManyChanges {};

// A directory the rescan lists: a start (fd open, rel, the rules above it) or a subdirectory of
// a listing (opened by the task).
struct DirTask {
  std::shared_ptr<Listing> parent;  // set: subdirectory `name` of it
  std::string name;
  int fd = -1;
  std::string rel;
  std::shared_ptr<const IgnoreRules> rules;
  bool walk = true;  // queue the subdirectories (else only those the previous manifest lacks)
};

// The rescan's fresh look, on a few threads: directories are tasks in a shared queue, each
// thread collects its own entries, the whole held in memory (bounded: TooManyChanges).
class Scanner {
 public:
  Scanner(const ScanOptions& opts, const Manifest& previous, size_t max_entries)
      : opts_(opts), fixed_(opts), max_entries_(max_entries) {
    previous_.reserve(previous.entries.size());
    for (auto& e : previous.entries) previous_.emplace(e.path, &e);
    previous_scan_ns_ = previous.scan_ns;
  }

  // Walks from the given directories; a listing that comes upon one of them leaves it to its
  // own task.
  ScanResult run(std::vector<DirTask> start) {
    for (auto& t : start) {
      starts_.insert(t.rel);
      queue_.push_back(std::move(t));
    }
    unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<ScanResult> parts(n);
    std::vector<std::thread> threads;
    for (unsigned i = 1; i < n; ++i) threads.push_back(runtime_thread([this, &parts, i] { work(parts[i]); }));
    work(parts[0]);
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    ScanResult out;
    for (auto& p : parts) {
      auto& dst = out.manifest.entries;
      dst.insert(dst.end(), std::make_move_iterator(p.manifest.entries.begin()),
                 std::make_move_iterator(p.manifest.entries.end()));
      out.skipped.insert(out.skipped.end(), p.skipped.begin(), p.skipped.end());
      out.too_large.insert(out.too_large.end(), p.too_large.begin(), p.too_large.end());
      out.hashed_files += p.hashed_files;
      out.hashed_bytes += p.hashed_bytes;
      out.reused += p.reused;
    }
    out.manifest.sort();
    return out;
  }

  const Entry* was(const std::string& rel) const {
    auto it = previous_.find(rel);
    return it == previous_.end() ? nullptr : it->second;
  }

 private:
  void work(ScanResult& out) {
    while (true) {
      DirTask task;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return !queue_.empty() || busy_ == 0 || error_; });
        if (error_ || queue_.empty()) {
          cv_.notify_all();
          return;
        }
        task = std::move(queue_.front());
        queue_.pop_front();
        ++busy_;
      }
      try {
        list(task, out);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        --busy_;
      }
      cv_.notify_all();
    }
  }

  void list(DirTask& task, ScanResult& out) {
    std::shared_ptr<Listing> l = task.parent ? detail::list_subdirectory(*task.parent, task.name, opts_, fixed_)
                                             : detail::list_directory(task.fd, task.rel, opts_, fixed_, task.rules);
    out.skipped.insert(out.skipped.end(), l->skipped.begin(), l->skipped.end());
    out.too_large.insert(out.too_large.end(), l->too_large.begin(), l->too_large.end());
    std::vector<DirTask> subdirs;
    detail::ListingReader rd(*l);
    for (; const Listing::Item* item = rd.peek(0); rd.pop()) {
      if (item->subtree) continue;
      Entry e = item->e;
      e.path = detail::join_path(l->rel, item->e.path);
      if (e.type == EntryType::Dir) {
        const Entry* before = was(e.path);
        if ((task.walk || !(before && before->type == EntryType::Dir)) && !starts_.count(e.path))
          subdirs.push_back({l, item->e.path, -1, e.path, nullptr, true});
      }
      if (e.type == EntryType::File && !hash_or_reuse(l->dir->get(), item->e.path, e, out)) continue;
      add(out, std::move(e));
    }
    if (!subdirs.empty()) {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& t : subdirs) queue_.push_back(std::move(t));
    }
  }

  // False when the file went away while we looked (not part of this state).
  bool hash_or_reuse(int dirfd, const std::string& name, Entry& e, ScanResult& out) {
    const Entry* old = was(e.path);
    if (old && detail::hash_still_valid(*old, e, previous_scan_ns_)) {
      e.hash = old->hash;
      ++out.reused;
      return true;
    }
    try {
      e.hash = hash_file(dirfd, name, e.path, &e.size, &e.mtime_ns, &e.ctime_ns, &e.ino);
    } catch (const std::system_error& ex) {
      if (ex.code().value() != ENOENT) throw;
      return false;
    }
    ++out.hashed_files;
    out.hashed_bytes += e.size;
    return true;
  }

  void add(ScanResult& out, Entry e) {
    if (entries_.fetch_add(1) >= max_entries_) throw TooManyChanges{};
    out.manifest.entries.push_back(std::move(e));
  }

 public:
  // The rules of the ignore files above directory rel (not its own) and whether rel or one of
  // its ancestors is ignored, read as a walk from the root would.
  std::shared_ptr<const IgnoreRules> rules_above(int rootfd, const std::string& rel, bool* ignored) {
    auto rules = std::make_shared<IgnoreRules>();
    *ignored = false;
    if (rel.empty()) return rules;
    size_t from = 0;
    std::string at;  // the directory whose ignore files apply next
    while (true) {
      if (opts_.use_ignore_files) {
        unique_fd fd;
        try {
          fd.reset(open_dir_nofollow(rootfd, at, false));  // "" gives the root, duplicated
        } catch (const std::exception&) {
        }
        if (fd) {
          for (const char* f : {".gitignore", ".xmeshignore"}) {
            std::string text;
            if (detail::read_small_file(fd.get(), f, text)) rules->add_text(at, text);
          }
        }
      }
      size_t slash = rel.find('/', from);
      std::string next = rel.substr(0, slash);
      IgnoreStack ignore{&fixed_.user, rules.get(), &fixed_.defaults};
      if ((at.empty() && next == kStateDirName) || ignore.ignored(next, true)) {
        *ignored = true;
        return rules;
      }
      if (slash == std::string::npos) return rules;
      at = next;
      from = slash + 1;
    }
  }

 private:
  const ScanOptions& opts_;
  detail::FixedRules fixed_;
  std::unordered_map<std::string_view, const Entry*> previous_;
  std::set<std::string> starts_;
  int64_t previous_scan_ns_ = 0;
  const size_t max_entries_;
  std::atomic<size_t> entries_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DirTask> queue_;
  int busy_ = 0;
  std::exception_ptr error_;
};

// path lies strictly under one of roots (a set of directories, never "").
bool strictly_under(std::string_view path, const std::set<std::string, std::less<>>& roots) {
  if (roots.empty()) return false;
  for (size_t slash = path.find('/'); slash != std::string_view::npos; slash = path.find('/', slash + 1))
    if (roots.count(path.substr(0, slash))) return true;
  return false;
}

// What a rescan replaces: the entries of listed directories and everything below walked ones
// (a walked directory's own entry comes from its parent's listing, if that was listed).
struct Replaced {
  std::set<std::string, std::less<>> walked, listed;
  bool operator()(std::string_view path) const {
    return listed.count(parent_dir(path)) || strictly_under(path, walked);
  }
};

// The directories that are string prefixes of the path being written (parents come before
// their children, though not always just before: "a" < "a.txt" < "a/b"): says whether an
// entry's parent is in the output.
class ParentStack {
 public:
  bool parent_present(const std::string& path) {
    while (!open_.empty() && path.compare(0, open_.back().size(), open_.back()) != 0) open_.pop_back();
    const std::string_view parent = parent_dir(path);
    if (parent.empty()) return true;
    for (auto o = open_.rbegin(); o != open_.rend(); ++o)
      if (*o == parent) return true;
    return false;
  }
  void written(const Entry& e) {
    if (e.type == EntryType::Dir) open_.push_back(e.path);
  }

 private:
  std::vector<std::string> open_;
};

// The previous entries the fresh look replaces or asks about (a listed directory's own entry
// tells whether it was a directory), in memory; TooManyChanges past max_entries.
Manifest previous_involved(const MappedManifest& previous, const Replaced& replaced, size_t max_entries) {
  Manifest out;
  out.scan_ns = previous.scan_ns();
  ManifestCursor c(std::shared_ptr<const MappedManifest>(std::shared_ptr<const MappedManifest>(), &previous));
  for (; !c.at_end(); c.next()) {
    const Entry& e = c.entry();
    if (!replaced(e.path) && !replaced.listed.count(e.path)) continue;
    if (out.entries.size() >= max_entries) throw TooManyChanges{};
    out.entries.push_back(e);
  }
  return out;
}

// What the changes replace: each walked directory not under another, each listed one not under
// a walked one (an ignored or vanished one too: its entries just go).
Replaced replaced_by(const ChangedDirs& changes) {
  Replaced r;
  for (auto& w : changes.walked)
    if (!strictly_under(w, r.walked)) r.walked.insert(w);  // sorted: an outer tree comes first
  for (auto& l : changes.listed)
    if (!r.walked.count(l) && !strictly_under(l, r.walked)) r.listed.insert(l);
  return r;
}

// The fresh look's starts: a listed directory that was not one before is walked whole (nothing
// of the previous scan lies below it, so what it replaces is the same).
std::vector<DirTask> rescan_starts(Scanner& s, int rootfd, const Replaced& replaced) {
  std::vector<DirTask> tasks;
  auto start = [&](const std::string& rel, bool walk) {
    bool ignored = false;
    auto rules = s.rules_above(rootfd, rel, &ignored);
    if (ignored) return;
    int fd = -1;
    try {
      fd = open_dir_nofollow(rootfd, rel, false);  // "" gives the root, duplicated
    } catch (const std::exception&) {
      return;
    }
    tasks.push_back({nullptr, "", fd, rel, rules, walk});
  };
  for (auto& w : replaced.walked) start(w, true);
  for (auto& l : replaced.listed) {
    const Entry* before = l.empty() ? nullptr : s.was(l);
    start(l, !l.empty() && !(before && before->type == EntryType::Dir));
  }
  return tasks;
}

// The notes (skipped, too_large) of the previous scan that still hold: not replaced, their
// parent still in the tree (judged by the merge as it passes their path), with the fresh ones.
template <typename Note>
class NoteCarrier {
 public:
  NoteCarrier(const std::vector<Note>& before, const Replaced& replaced) {
    for (auto& n : before)
      if (!replaced(n.first)) pending_.push_back(n);
    std::sort(pending_.begin(), pending_.end());
  }
  // Before `path` is written: the notes that sort before it are judged now.
  void up_to(const std::string* path, ParentStack& parents, std::vector<Note>& out) {
    for (; next_ < pending_.size() && (!path || pending_[next_].first < *path); ++next_)
      if (parents.parent_present(pending_[next_].first)) out.push_back(pending_[next_]);
  }

 private:
  std::vector<Note> pending_;
  size_t next_ = 0;
};

// The previous manifest less what was replaced, merged with the fresh look, into out.
void merge_rescan(const MappedManifest& previous, const Replaced& replaced, ScanResult& fresh, const ScanResult& notes,
                  detail::ScanWriter& out, ScanResult& r) {
  ParentStack parents;
  NoteCarrier<std::pair<std::string, std::string>> skipped(notes.skipped, replaced);
  NoteCarrier<std::pair<std::string, uint64_t>> too_large(notes.too_large, replaced);
  auto write = [&](const Entry& e, bool kept) {
    skipped.up_to(&e.path, parents, r.skipped);
    too_large.up_to(&e.path, parents, r.too_large);
    if (!parents.parent_present(e.path)) return;  // its directory is gone (removed, or a file now)
    out.add(e);
    parents.written(e);
    if (kept && e.type == EntryType::File) ++r.reused;
  };
  ManifestCursor a(std::shared_ptr<const MappedManifest>(std::shared_ptr<const MappedManifest>(), &previous));
  const auto& b = fresh.manifest.entries;
  size_t j = 0;
  while (!a.at_end() || j < b.size()) {
    if (!a.at_end() && replaced(a.entry().path)) {
      a.next();
      continue;
    }
    if (j == b.size() || (!a.at_end() && a.entry().path < b[j].path)) {
      write(a.entry(), true);
      a.next();
    } else {
      if (!a.at_end() && a.entry().path == b[j].path) a.next();  // the fresh look wins
      write(b[j++], false);
    }
  }
  skipped.up_to(nullptr, parents, r.skipped);
  too_large.up_to(nullptr, parents, r.too_large);
}

}  // namespace

ScanResult rescan_tree(const std::string& root, const ScanOptions& opts, const MappedManifest& previous,
                       const ScanResult& notes, const ChangedDirs& changes, int64_t started_ns,
                       const std::string& out_path, size_t max_fresh) {
  if (changes.everything || changes.walked.count("")) return scan_tree_to(root, opts, &previous, out_path);
  int rootfd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) throw std::runtime_error("cannot open workspace " + root + ": " + std::strerror(errno));
  unique_fd root_fd(rootfd);
  const Replaced replaced = replaced_by(changes);
  ScanResult fresh;
  try {
    Manifest involved = previous_involved(previous, replaced, max_fresh);
    Scanner s(opts, involved, max_fresh);
    fresh = s.run(rescan_starts(s, rootfd, replaced));
  } catch (const TooManyChanges&) {
    return scan_tree_to(root, opts, &previous, out_path);  // a change this large: the whole walk
  }
  ScanResult r;
  r.hashed_files = fresh.hashed_files;
  r.hashed_bytes = fresh.hashed_bytes;
  r.reused = fresh.reused;
  r.incremental = true;
  detail::ScanWriter out(out_path, started_ns);
  merge_rescan(previous, replaced, fresh, notes, out, r);
  r.skipped.insert(r.skipped.end(), fresh.skipped.begin(), fresh.skipped.end());
  r.too_large.insert(r.too_large.end(), fresh.too_large.begin(), fresh.too_large.end());
  std::sort(r.skipped.begin(), r.skipped.end());
  std::sort(r.too_large.begin(), r.too_large.end());
  out.finish(r);
  return r;
}

ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous) {
  std::shared_ptr<const MappedManifest> before = previous ? mapped_copy(*previous) : nullptr;
  ScanResult r = scan_tree_to(root, opts, before.get(), "");
  r.manifest = r.file->load();
  return r;
}

}  // namespace xmesh::ws
