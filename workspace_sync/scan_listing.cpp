#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "path_safety.hpp"
#include "scan_internal.hpp"

namespace xmesh::ws::detail {

FixedRules::FixedRules(const ScanOptions& opts) {
  for (auto& p : opts.excludes) user.add_line("", p);
  if (opts.default_excludes)
    for (const char* p : kDefaultExcludes) defaults.add_line("", p);
}

bool read_small_file(int dirfd, const char* name, std::string& out) {
  unique_fd fd(openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof(buf))) > 0 && out.size() < (1 << 20)) out.append(buf, static_cast<size_t>(n));
  return true;
}

std::string join_path(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

bool hash_still_valid(const Entry& old, const Entry& now, int64_t previous_scan_ns) {
  return old.type == EntryType::File && old.size == now.size && old.mtime_ns == now.mtime_ns &&
         old.ctime_ns == now.ctime_ns && old.ino == now.ino && now.mtime_ns < previous_scan_ns - kRacyWindowNs;
}

namespace {

// The directory's own rule files added to its ancestors' (the same object when it has none).
std::shared_ptr<const IgnoreRules> rules_inside(int fd, const std::string& rel, const ScanOptions& opts,
                                                std::shared_ptr<const IgnoreRules> parent) {
  if (!opts.use_ignore_files) return parent;
  std::shared_ptr<IgnoreRules> mine;
  for (const char* f : {".gitignore", ".xmeshignore"}) {
    std::string text;
    if (!read_small_file(fd, f, text)) continue;
    if (!mine) mine = std::make_shared<IgnoreRules>(*parent);
    mine->add_text(rel, text);
  }
  return mine ? mine : parent;
}

// A symlink's item, or false with the reason in the listing's skipped.
bool read_symlink(int dirfd, const char* name, const std::string& rel, const struct stat& st, Listing::Item& item,
                  Listing& out) {
  std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
  ssize_t n = readlinkat(dirfd, name, target.data(), target.size());
  if (n < 0) {
    out.skipped.emplace_back(rel, std::string("cannot read the link: ") + std::strerror(errno));
    return false;
  }
  target.resize(static_cast<size_t>(n));
  std::string why;
  if (!symlink_stays_inside(rel, target, &why)) {
    out.skipped.emplace_back(rel, "symlink to " + target + " " + why);
    return false;
  }
  item.e.type = EntryType::Symlink;
  item.e.mode = 0777;
  item.e.size = target.size();
  item.e.target = std::move(target);
  return true;
}

// One directory entry judged: kept (an item, two for a directory), noted or passed over.
void add_item(int dirfd, const char* name, const std::string& rel, const IgnoreStack& ignore, const ScanOptions& opts,
              Listing& out) {
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // vanished meanwhile
  const bool is_dir = S_ISDIR(st.st_mode);
  if (ignore.ignored(rel, is_dir)) return;
  Listing::Item item;
  item.e.path = name;
  item.e.mode = st.st_mode & 07777;
  if (is_dir) {
    // Kept only when it opens (the walk that lists it later opens it again).
    if (!unique_fd(openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC))) {
      out.skipped.emplace_back(rel, std::string("cannot open: ") + std::strerror(errno));
      return;
    }
    item.e.type = EntryType::Dir;
    out.items.push_back(item);
    item.subtree = true;
    item.e.path += '/';
  } else if (S_ISREG(st.st_mode)) {
    if (opts.max_file_size && uint64_t(st.st_size) > opts.max_file_size) {
      out.too_large.emplace_back(rel, uint64_t(st.st_size));
      return;
    }
    item.e.type = EntryType::File;
    item.e.size = uint64_t(st.st_size);
    item.e.mtime_ns = timespec_ns(st.st_mtim);
    item.e.ctime_ns = timespec_ns(st.st_ctim);
    item.e.ino = st.st_ino;
  } else if (S_ISLNK(st.st_mode)) {
    if (!read_symlink(dirfd, name, rel, st, item, out)) return;
  } else {
    const char* kind = S_ISFIFO(st.st_mode) ? "a named pipe" : S_ISSOCK(st.st_mode) ? "a socket" : "a device file";
    out.skipped.emplace_back(rel, std::string("is ") + kind);
    return;
  }
  out.items.push_back(std::move(item));
}

void sort_items(std::vector<Listing::Item>& items) {
  std::sort(items.begin(), items.end(), [](const Listing::Item& a, const Listing::Item& b) { return a.e.path < b.e.path; });
}

// The listing's items so far, sorted, as a run in a scratch file (the cache form: a subtree
// item's path ends with '/').
void spill_chunk(Listing& l) {
  sort_items(l.items);
  const std::string path = make_scratch_file("xmesh-listing");
  try {
    CacheWriter w(path, 0);
    for (auto& item : l.items) w.add(item.e);
    l.runs.push_back(w.commit_mapped());
  } catch (...) {
    unlink(path.c_str());
    throw;
  }
  unlink(path.c_str());  // mapped: the pages live on, the name goes
  l.items.clear();
}

}  // namespace

ListingReader::ListingReader(const Listing& l) : l_(l) {
  runs_.reserve(l.runs.size());
  for (auto& r : l.runs) {
    runs_.emplace_back(r);
    if (!runs_.back().at_end()) heap_.push_back(runs_.size() - 1);
  }
  auto later = [this](size_t a, size_t b) { return runs_[b].entry().path < runs_[a].entry().path; };
  std::make_heap(heap_.begin(), heap_.end(), later);
}

bool ListingReader::pull(Listing::Item& out) {
  // heap_: the runs not at their end, the one with the smallest current key on top.
  auto later = [this](size_t a, size_t b) { return runs_[b].entry().path < runs_[a].entry().path; };
  const bool tail_left = tail_ < l_.items.size();
  if (heap_.empty() && !tail_left) return false;
  if (tail_left && (heap_.empty() || l_.items[tail_].e.path < runs_[heap_.front()].entry().path)) {
    out = l_.items[tail_++];
    return true;
  }
  std::pop_heap(heap_.begin(), heap_.end(), later);
  ManifestCursor& c = runs_[heap_.back()];
  out.e = c.entry();
  out.subtree = !out.e.path.empty() && out.e.path.back() == '/';
  c.next();
  if (c.at_end()) {
    heap_.pop_back();
  } else {
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  return true;
}

const Listing::Item* ListingReader::peek(size_t k) {
  if (k >= kLook) return nullptr;
  if (l_.runs.empty()) return pos_ + k < l_.items.size() ? &l_.items[pos_ + k] : nullptr;
  while (window_.size() <= k) {
    Listing::Item item;
    if (!pull(item)) return nullptr;
    window_.push_back(std::move(item));
  }
  return &window_[k];
}

void ListingReader::pop() {
  if (l_.runs.empty())
    ++pos_;
  else if (!window_.empty())
    window_.pop_front();
}

std::shared_ptr<Listing> list_directory(int fd, const std::string& rel, const ScanOptions& opts,
                                        const FixedRules& fixed, std::shared_ptr<const IgnoreRules> parent_rules) {
  auto out = std::make_shared<Listing>();
  out->rel = rel;
  out->dir = std::make_shared<unique_fd>(fd);
  out->rules = rules_inside(fd, rel, opts, std::move(parent_rules));
  IgnoreStack ignore{&fixed.user, out->rules.get(), &fixed.defaults};
  int fd2 = dup(fd);
  DIR* d = fd2 >= 0 ? fdopendir(fd2) : nullptr;
  if (!d) {
    if (fd2 >= 0) close(fd2);
    out->skipped.emplace_back(rel.empty() ? "." : rel, std::string("cannot list: ") + std::strerror(errno));
    return out;
  }
  while (dirent* de = readdir(d)) {
    const char* name = de->d_name;
    if (!std::strcmp(name, ".") || !std::strcmp(name, "..")) continue;
    if (rel.empty() && !std::strcmp(name, kStateDirName)) continue;  // a host copy's own state
    add_item(fd, name, join_path(rel, name), ignore, opts, *out);
    if (out->items.size() >= kListChunk) spill_chunk(*out);
  }
  closedir(d);
  sort_items(out->items);
  return out;
}

std::shared_ptr<Listing> list_subdirectory(const Listing& parent, const std::string& name, const ScanOptions& opts,
                                           const FixedRules& fixed) {
  const std::string rel = join_path(parent.rel, name);
  int fd = openat(parent.dir->get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    auto out = std::make_shared<Listing>();
    out->rel = rel;
    out->opened = false;
    out->skipped.emplace_back(rel, std::string("cannot open: ") + std::strerror(errno));
    return out;
  }
  return list_directory(fd, rel, opts, fixed, parent.rules);
}

void ScanWriter::Counts::add(const Entry& e) {
  ++entries;
  files += e.type == EntryType::File;
  dirs += e.type == EntryType::Dir;
  symlinks += e.type == EntryType::Symlink;
  if (e.type == EntryType::File) bytes += e.size;
}

ScanWriter::ScanWriter(const std::string& out_path, int64_t scan_ns) : out_path_(out_path), scan_ns_(scan_ns) {
  if (!out_path_.empty()) {
    try {
      writer_ = std::make_unique<CacheWriter>(out_path_, scan_ns);
      return;
    } catch (const std::runtime_error&) {
      // Only a cache: where it cannot be written, the scan goes to a file of its own.
    }
  }
  temp_ = out_path_ = make_scratch_file("xmesh-scan");
  writer_ = std::make_unique<CacheWriter>(out_path_, scan_ns);
}

ScanWriter::~ScanWriter() {
  writer_.reset();  // an unfinished file aside goes with it
  if (!temp_.empty()) unlink(temp_.c_str());
}

void ScanWriter::add(const Entry& e) {
  writer_->add(e);
  digest_.add(e);
  counts_.add(e);
  if (e.type != EntryType::Symlink) return;
  Entry link;
  link.path = e.path;
  link.type = e.type;
  link.target = e.target;
  links_.entries.push_back(std::move(link));
}

void ScanWriter::finish(ScanResult& r) {
  auto dropped = links_through_links(links_);  // judged against the tree's links only
  std::shared_ptr<const MappedManifest> file = writer_->commit_mapped();
  writer_.reset();
  Hash128 digest = digest_.finish();
  if (!dropped.empty()) {  // rare: the file again, without them (dropped is in path order)
    CacheWriter again(out_path_, scan_ns_);
    DigestBuilder d2;
    counts_ = Counts();
    for (ManifestCursor c(file); !c.at_end(); c.next()) {
      const Entry& e = c.entry();
      const bool refused = e.type == EntryType::Symlink &&
                           std::binary_search(dropped.begin(), dropped.end(), std::make_pair(e.path, std::string()),
                                              [](auto& a, auto& b) { return a.first < b.first; });
      if (refused) continue;
      again.add(e);
      d2.add(e);
      counts_.add(e);
    }
    file = again.commit_mapped();
    digest = d2.finish();
    for (auto& d : dropped)
      if (std::find(r.skipped.begin(), r.skipped.end(), d) == r.skipped.end()) r.skipped.push_back(std::move(d));
    std::sort(r.skipped.begin(), r.skipped.end());
  }
  if (!temp_.empty()) unlink(temp_.c_str());  // mapped: the pages live on, the name goes
  temp_.clear();
  r.file = std::move(file);
  r.digest = digest;
  r.entries = counts_.entries;
  r.files = counts_.files;
  r.dirs = counts_.dirs;
  r.symlinks = counts_.symlinks;
  r.bytes = counts_.bytes;
}

}  // namespace xmesh::ws::detail
