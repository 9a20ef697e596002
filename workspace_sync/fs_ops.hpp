// File-system steps of the receiving side, all relative to directory descriptors and never
// following a symlink on the way (a link placed on the host cannot redirect a write).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "manifest.hpp"
#include "manifest_file.hpp"
#include "unique_fd.hpp"

namespace xmesh::ws {

// The whole of n bytes written (at offset `at` for pwrite_all, else at the file's position) or
// read (at `at`), over short transfers and EINTR. False with errno set when the system refuses
// (errno 0: a read found the end of the file first); callers say what failed.
bool write_all(int fd, const void* data, size_t n);
bool pwrite_all(int fd, const void* data, size_t n, uint64_t at);
bool pread_all(int fd, void* data, size_t n, uint64_t at);

// Opens directory `rel` ("" = dirfd itself, duplicated) under dirfd one component at a time
// with O_NOFOLLOW; with create, missing components are made (mode 0755 before umask). Throws
// std::runtime_error naming the path (a component that is a symlink or a file is refused).
int open_dir_nofollow(int dirfd, const std::string& rel, bool create);
// Opens regular file `name` under dirfd for reading: never follows a link, never waits on a
// FIFO; anything but a regular file is refused (std::runtime_error / std::system_error naming
// display_path).
int open_regular_at(int dirfd, const std::string& name, const std::string& display_path);
// Copies regular file src (relative to srcdir, not followed if a link) to a new file dst in
// dstdir; returns the XXH3-128 of what it copied (the caller checks it against the manifest).
Hash128 copy_file_at(int srcdir, const std::string& src, int dstdir, const std::string& dst);
// Removes a directory tree given by absolute path (the staging area); errors are ignored.
void remove_tree(const std::string& path);
void make_dirs_path(const std::string& path);  // mkdir -p, mode 0700 for state directories
bool read_whole_file(const std::string& path, std::string& out);
void write_file_replacing(const std::string& path, std::string_view data);  // write aside, then rename
// The same for content made in pieces: written aside as it comes, renamed over path by
// commit(); the aside file goes if commit() is never reached (a throw on the way).
class ReplacingFile {
 public:
  explicit ReplacingFile(std::string path);  // throws std::runtime_error naming the file
  ~ReplacingFile();
  ReplacingFile(const ReplacingFile&) = delete;
  ReplacingFile& operator=(const ReplacingFile&) = delete;
  void write(std::string_view data);
  void write_at(uint64_t offset, std::string_view data);  // over what was written there
  int fd() const { return fd_; }  // the file aside (readable), until commit()
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};
// A manifest's cache form written entry by entry in pieces of 1 MiB, aside, and saved over path
// by commit() with its count set last: a million entries (~80 MiB) are never one string.
// Nothing replaces path when commit() is not reached. std::runtime_error when a write fails.
class CacheWriter {
 public:
  CacheWriter(const std::string& path, int64_t scan_ns);
  void add(const Entry& e);
  uint64_t count() const { return count_; }
  void commit();
  // commit(), returning the file written mapped (mapped before its rename: what this writer
  // wrote, whatever another process renames over path meanwhile).
  std::shared_ptr<const MappedManifest> commit_mapped();

 private:
  void finish_writing();
  ReplacingFile file_;
  std::string piece_;
  uint64_t count_ = 0;
};
void save_manifest_cache(const std::string& path, const Manifest& m);
// A new empty file of its own in $TMPDIR (else /tmp), named after stem; its path.
// std::runtime_error naming the directory when none can be made.
std::string make_scratch_file(const std::string& stem);
// A manifest held in memory as a mapped file (written to a scratch file, mapped, unlinked).
std::shared_ptr<const MappedManifest> mapped_copy(const Manifest& m);

}  // namespace xmesh::ws
