// The workspace sync core (workspace_sync/): manifests, diffs, ignore rules, the racy-file rule,
// path safety, and the receiving side applying real trees.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <fstream>
#include <sstream>

#include "fs_ops.hpp"
#include "ignore.hpp"
#include "path_safety.hpp"
#include "receiver.hpp"
#include "sender.hpp"
#include "scan.hpp"
#include "scan_internal.hpp"
#include "workspace_helpers.hpp"

TEST_CASE("manifests round-trip and their digest covers what a host reproduces", "[workspace]") {
  Manifest m;
  m.entries = {dir_entry("pkg"), file_entry("pkg/a.py", "x = 1\n"), file_entry("run.sh", "echo\n", 0755)};
  Entry l;
  l.path = "z";
  l.type = EntryType::Symlink;
  l.target = "pkg/a.py";
  l.size = l.target.size();
  m.entries.push_back(l);
  m.sort();
  Manifest back = Manifest::decode_wire(m.encode_wire());
  REQUIRE(back.entries.size() == 4);
  CHECK(back.digest() == m.digest());
  CHECK(back.entries[3].target == "pkg/a.py");

  m.scan_ns = 123;
  m.entries[1].mtime_ns = 5;
  TempDir dir;
  save_manifest_cache(dir.path + "/m.manifest", m);  // the cache form (CacheWriter)
  auto mapped = MappedManifest::open(dir.path + "/m.manifest");
  REQUIRE(mapped);
  Manifest cached = mapped->load();
  CHECK(cached.scan_ns == 123);
  CHECK(cached.entries[1].mtime_ns == 5);
  write(dir.path + "/garbage", "garbage, not a manifest");
  CHECK_FALSE(MappedManifest::open(dir.path + "/garbage"));
  // The form before XMC2 (the count a varint, at most 127 here: one byte) still reads.
  std::string v2;
  REQUIRE(read_whole_file(dir.path + "/m.manifest", v2));
  REQUIRE(m.entries.size() < 128);
  std::string v1 = "XMC1" + v2.substr(4, 8) + std::string(1, char(m.entries.size())) + v2.substr(20);
  write(dir.path + "/v1.manifest", v1);
  auto mapped_v1 = MappedManifest::open(dir.path + "/v1.manifest");
  REQUIRE(mapped_v1);
  Manifest old = mapped_v1->load();
  CHECK(old.digest() == m.digest());
  CHECK(old.entries[1].mtime_ns == 5);
  // Read back entry by entry from a file: the same entries, and the scan time first.
  Manifest streamed;
  CHECK(for_each_cached_entry(dir.path + "/m.manifest", [&](int64_t ns) { streamed.scan_ns = ns; },
                              [&](Entry&& e) { streamed.entries.push_back(std::move(e)); }));
  CHECK(streamed.scan_ns == 123);
  CHECK(streamed.digest() == m.digest());
  write(dir.path + "/cut.manifest", v2.substr(0, v2.size() - 5));
  CHECK_FALSE(for_each_cached_entry(dir.path + "/cut.manifest", [](int64_t) {}, [](Entry&&) {}));
  CHECK_FALSE(for_each_cached_entry(dir.path + "/missing.manifest", [](int64_t) {}, [](Entry&&) {}));
  // The digest built entry by entry is the manifest's.
  DigestBuilder built;
  for (auto& e : m.entries) built.add(e);
  CHECK(built.finish() == m.digest());

  Manifest other = m;
  other.entries[2].mode = 0644;  // the executable bit matters
  CHECK(other.digest() != m.digest());
  other = m;
  other.entries[1].hash = hash_bytes("y", 1);
  CHECK(other.digest() != m.digest());
  other = m;
  other.entries[3].target = "run.sh";
  CHECK(other.digest() != m.digest());
  other = m;
  other.entries[1].mtime_ns = 999;  // local stat values are not part of it
  CHECK(other.digest() == m.digest());
}

TEST_CASE("malformed manifests are refused with a reason", "[workspace]") {
  Manifest m;
  m.entries = {file_entry("a", "1"), file_entry("b", "2")};
  std::string wire = m.encode_wire();
  CHECK_THROWS_WITH(Manifest::decode_wire(wire.substr(0, wire.size() - 3)), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(Manifest::decode_wire("nope"), Catch::Contains("not an xmesh workspace manifest"));
  std::swap(m.entries[0], m.entries[1]);
  CHECK_THROWS_WITH(Manifest::decode_wire(m.encode_wire()), Catch::Contains("not sorted"));
  // Device files (or any other type) cannot be expressed: the type byte is refused.
  Manifest dev;
  dev.entries = {file_entry("dev", "")};
  for (char t : {'c', 'b', 'p'}) {
    std::string w = dev.encode_wire();
    w[4 + 1 + 1 + 3] = t;  // magic, count, path length, "dev", then the type
    CHECK_THROWS_WITH(Manifest::decode_wire(w), Catch::Contains("unknown type"));
  }
}

TEST_CASE("a delta plan holds the entries added or changed and the paths deleted, in parts", "[workspace]") {
  Manifest a, b;
  a.entries = {file_entry("keep", "1"), file_entry("mode", "2"), file_entry("edit", "3"), file_entry("gone", "4")};
  b.entries = {file_entry("keep", "1"), file_entry("mode", "2", 0755), file_entry("edit", "33"), file_entry("new", "5")};
  a.sort();
  b.sort();
  Delta d = delta_of(a, b);
  CHECK(paths(d.upserts) == std::vector<std::string>{"edit", "mode", "new"});
  CHECK(paths(d.deleted) == std::vector<std::string>{"gone"});
  CHECK(delta_of(a, a).upserts.entries.empty());
  CHECK(delta_of(a, a).deleted.entries.empty());
  // In parts of one entry: each part's files are the ones it may be asked for, by hash; the
  // whole manifest goes in as many parts as it has entries, numbered by their place in it.
  PlanParts parts(mapped_copy(b), mapped_copy(a), 1);
  std::vector<std::string> seen;
  PlanPart p;
  while (parts.next(p)) {
    CHECK(p.entries == 1);
    for (auto& f : p.files) seen.push_back(f.e.path + "#" + std::to_string(f.ordinal));
  }
  CHECK(seen == std::vector<std::string>{"edit#0", "mode#2", "new#3"});
  PlanParts whole(mapped_copy(b), nullptr, 3);
  REQUIRE(whole.next(p));
  CHECK(p.frames.size() == 1);
  CHECK(paths(Manifest::decode_wire(p.frames[0])) == std::vector<std::string>{"edit", "keep", "mode"});
  CHECK_FALSE(p.last);
  REQUIRE(whole.next(p));
  CHECK(p.last);
  CHECK_FALSE(whole.next(p));
}

TEST_CASE("glob patterns follow gitignore's rules", "[workspace]") {
  CHECK(glob_match("*.py", "a.py"));
  CHECK_FALSE(glob_match("*.py", "dir/a.py"));  // '*' stays within a component
  CHECK(glob_match("**/a.py", "a.py"));
  CHECK(glob_match("**/a.py", "x/y/a.py"));
  CHECK(glob_match("x/**", "x/y/z"));
  CHECK_FALSE(glob_match("x/**", "x"));
  CHECK(glob_match("a/**/b", "a/b"));
  CHECK(glob_match("a/**/b", "a/x/y/b"));
  CHECK(glob_match("file?.txt", "file1.txt"));
  CHECK_FALSE(glob_match("file?.txt", "file/.txt"));
  CHECK(glob_match("[a-c]*.log", "b1.log"));
  CHECK_FALSE(glob_match("[!a-c]*.log", "b1.log"));
  CHECK(glob_match("\\*star", "*star"));
  CHECK_FALSE(glob_match("\\*star", "xstar"));
}

TEST_CASE("ignore rules: anchoring, directories only, re-includes, nesting, excludes win", "[workspace]") {
  IgnoreRules files;
  files.add_text("", "# comment\n*.log\n!keep.log\n/build\ndata/\ndocs/*.tmp\n");
  files.add_text("sub", "local.txt\n/anchored.txt\n");
  IgnoreRules user;
  user.add_line("", "keep.log");
  IgnoreStack s{nullptr, &files, nullptr};
  CHECK(s.ignored("x.log", false));
  CHECK(s.ignored("deep/x.log", false));
  CHECK_FALSE(s.ignored("keep.log", false));
  CHECK(s.ignored("build", true));
  CHECK_FALSE(s.ignored("src/build", true));  // anchored to the root
  CHECK(s.ignored("data", true));
  CHECK_FALSE(s.ignored("data", false));  // dir-only pattern, and this is a file
  CHECK(s.ignored("docs/a.tmp", false));
  CHECK_FALSE(s.ignored("docs/x/a.tmp", false));
  CHECK(s.ignored("sub/local.txt", false));
  CHECK(s.ignored("sub/deeper/local.txt", false));
  CHECK_FALSE(s.ignored("local.txt", false));  // a rule file applies below its own directory
  CHECK(s.ignored("sub/anchored.txt", false));
  CHECK_FALSE(s.ignored("sub/deeper/anchored.txt", false));
  IgnoreStack with_user{&user, &files, nullptr};
  CHECK(with_user.ignored("keep.log", false));  // the caller's exclude wins over a file's '!'
}

TEST_CASE("the scanner applies rule files, skips what cannot travel, and lists large files", "[workspace]") {
  TempDir t;
  write(t.path + "/.gitignore", "*.log\nbuild/\n");
  write(t.path + "/a.py", "a");
  write(t.path + "/x.log", "log");
  write(t.path + "/build/out.o", "o");
  write(t.path + "/sub/.xmeshignore", "secret.txt\n");
  write(t.path + "/sub/secret.txt", "s");
  write(t.path + "/sub/b.py", "b");
  write(t.path + "/sub/__pycache__/b.cpython-311.pyc", "pyc");
  write(t.path + "/big.bin", std::string(5000, 'x'));
  REQUIRE(symlink("a.py", (t.path + "/inside").c_str()) == 0);
  REQUIRE(symlink("../../etc/passwd", (t.path + "/sub/escape").c_str()) == 0);
  REQUIRE(symlink("/etc/passwd", (t.path + "/absolute").c_str()) == 0);
  REQUIRE(mkfifo((t.path + "/pipe").c_str(), 0600) == 0);
  ScanOptions o;
  o.max_file_size = 4096;
  o.excludes = {"sub/b.py"};
  ScanResult r = scan_tree(t.path, o, nullptr);
  CHECK(paths(r.manifest) == std::vector<std::string>{".gitignore", "a.py", "inside", "sub", "sub/.xmeshignore"});
  REQUIRE(r.too_large.size() == 1);
  CHECK(r.too_large[0].first == "big.bin");
  std::map<std::string, std::string> skipped(r.skipped.begin(), r.skipped.end());
  CHECK_THAT(skipped["pipe"], Catch::Contains("named pipe"));
  CHECK_THAT(skipped["absolute"], Catch::Contains("outside the workspace"));
  CHECK_THAT(skipped["sub/escape"], Catch::Contains("outside the workspace"));
  CHECK_THROWS_WITH(scan_tree(t.path + "/missing", o, nullptr), Catch::Contains("cannot open workspace"));
}

TEST_CASE("the scan writes its manifest in byte order as it walks, whatever the names", "[workspace]") {
  TempDir t, out;
  // Names on both sides of '/' (0x2f) in byte order: a directory's contents come after its
  // siblings that extend its name with a smaller byte ("a" < "a-b" < "a.txt" < "a/x" < "a0").
  for (const char* f : {"a-b", "a.txt", "a0", "a b", "A", "a/x", "a/x.y/z", "a/x-y", "a-/q", "a./r", "\xc3\xa9t\xc3\xa9",
                        "z/\x7f", "a/w/deep/er", "b/a-", "b/a.b/c", "b/a/c"})
    write(t.path + "/" + f, f);
  ScanResult r = scan_tree_to(t.path, {}, nullptr, out.path + "/scan.manifest");
  auto again = MappedManifest::open(out.path + "/scan.manifest");  // the file at out_path is the manifest
  REQUIRE(again);
  Manifest m = again->load();
  CHECK(m.digest() == r.digest);
  CHECK(r.file->count() == m.entries.size());
  CHECK(r.entries == m.entries.size());
  CHECK(r.files == 16);
  CHECK(r.dirs == m.entries.size() - 16);
  CHECK(r.hashed_files == 16);
  std::vector<std::string> got = paths(m), sorted = got;
  std::sort(sorted.begin(), sorted.end());
  CHECK(got == sorted);
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  CHECK_NOTHROW(check_manifest(m));  // parents before children, each parent a directory
  CHECK(m.find("a/w/deep/er"));
  CHECK(m.find("a/x.y/z")->hash == hash_bytes("a/x.y/z", 7));
  // The same tree from many directories of many files (more than are listed ahead, more
  // entries than the hashing window): every file once, in order, hashed right.
  TempDir wide;
  for (int d = 0; d < 40; ++d)
    for (int i = 0; i < 150; ++i) write(wide.path + "/d" + std::to_string(d) + "/f" + std::to_string(i), std::to_string(d * 1000 + i));
  ScanResult w = scan_tree(wide.path, {}, nullptr);
  CHECK(w.manifest.entries.size() == 40 + 6000);
  CHECK(std::is_sorted(w.manifest.entries.begin(), w.manifest.entries.end(),
                       [](const Entry& a, const Entry& b) { return a.path < b.path; }));
  CHECK(w.manifest.find("d7/f42")->hash == hash_bytes("7042", 4));
  CHECK(w.digest == w.manifest.digest());
}

TEST_CASE("a directory of more entries than a chunk is listed in sorted runs, read back merged", "[workspace]") {
  TempDir t;
  const size_t n = 2 * detail::kListChunk + 100;
  for (size_t i = 0; i < n; ++i) {
    const std::string name = "e" + std::to_string(100000 + (i * 7919) % n);  // not in name order
    if (i % 1000 == 0)
      write(t.path + "/flat/" + name + "/inside", name);  // a few directories among the files
    else
      write(t.path + "/flat/" + name, name);
  }
  detail::FixedRules fixed(ScanOptions{});
  int fd = open((t.path + "/flat").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  auto l = detail::list_directory(fd, "flat", {}, fixed, std::make_shared<IgnoreRules>());
  CHECK(l->runs.size() == 2);  // two full chunks spilled; the rest in memory
  CHECK(l->items.size() < detail::kListChunk);
  detail::ListingReader rd(*l);
  std::vector<std::string> keys;
  size_t subtrees = 0;
  for (; const detail::Listing::Item* item = rd.peek(0); rd.pop()) {
    keys.push_back(item->e.path);
    subtrees += item->subtree;
    if (item->subtree) CHECK(item->e.type == EntryType::Dir);
    if (!item->subtree && item->e.type == EntryType::File) CHECK(item->e.size == 7);
  }
  CHECK(keys.size() == n + subtrees);
  CHECK(subtrees == (n + 999) / 1000);
  CHECK(std::is_sorted(keys.begin(), keys.end()));
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  // The whole scan through those runs: every file once, in order, with its content's hash.
  ScanResult r = scan_tree(t.path, {}, nullptr);
  CHECK(r.files == n);
  CHECK_NOTHROW(check_manifest(r.manifest));
  CHECK(r.manifest.find("flat/e100001")->hash == hash_bytes("e100001", 7));
  CHECK(r.manifest.find("flat/e100000/inside")->hash == hash_bytes("e100000", 7));
}

TEST_CASE("a previous manifest that does not read costs hashes, not the truth", "[workspace]") {
  TempDir t, out;
  for (int i = 0; i < 300; ++i) write(t.path + "/d" + std::to_string(i % 3) + "/f" + std::to_string(i), std::to_string(i));
  const std::string cache = out.path + "/scan.manifest";
  usleep(1100 * 1000);  // past the racy window: the next scans may reuse the first one's hashes
  ScanResult first = scan_tree_to(t.path, {}, nullptr, cache);
  ScanResult reused = scan_tree_to(t.path, {}, MappedManifest::open(cache).get(), out.path + "/2.manifest");
  CHECK(reused.reused == 300);
  CHECK(reused.digest == first.digest);
  // Cut the file in the middle of its entries (the header still promises them all).
  struct stat st;
  REQUIRE(stat(cache.c_str(), &st) == 0);
  REQUIRE(truncate(cache.c_str(), st.st_size / 2) == 0);
  auto damaged = MappedManifest::open(cache);
  REQUIRE(damaged);
  ScanResult r = scan_tree_to(t.path, {}, damaged.get(), "");
  CHECK(r.digest == first.digest);
  CHECK(r.reused > 0);
  CHECK(r.reused < 300);
  CHECK(r.reused + r.hashed_files == 300);
}

TEST_CASE("the racy-file rule: a stat match within a second of the previous scan is re-hashed", "[workspace]") {
  TempDir t;
  write(t.path + "/f", "new!");
  ScanResult now = scan_tree(t.path, {}, nullptr);
  REQUIRE(now.manifest.entries.size() == 1);
  const Entry& real = now.manifest.entries[0];
  // A previous scan that saw the same size, mtime, ctime and inode but other content: the edit
  // happened in the same timestamp tick, right after that scan looked.
  Manifest previous = now.manifest;
  previous.entries[0].hash = hash_bytes("old!", 4);
  previous.scan_ns = real.mtime_ns + 200000000;  // 0.2 s after the file's mtime
  ScanResult again = scan_tree(t.path, {}, &previous);
  CHECK(again.hashed_files == 1);
  CHECK(again.manifest.entries[0].hash == real.hash);  // the edit is seen
  // The same stat values with the previous scan well after the mtime: the hash is trusted.
  previous.scan_ns = real.mtime_ns + 3000000000LL;
  ScanResult trusted = scan_tree(t.path, {}, &previous);
  CHECK(trusted.reused == 1);
  CHECK(trusted.manifest.entries[0].hash == hash_bytes("old!", 4));
  // Any stat difference (here the inode) re-hashes regardless of the time.
  previous.entries[0].ino += 1;
  CHECK(scan_tree(t.path, {}, &previous).hashed_files == 1);
}

TEST_CASE("path safety refuses escapes, absolute paths and the state directory", "[workspace]") {
  std::string why;
  CHECK(valid_relative_path("a/b.py", &why));
  CHECK(valid_relative_path("", &why, true));
  CHECK_FALSE(valid_relative_path("", &why));
  CHECK_FALSE(valid_relative_path("../x", &why));
  CHECK(why == "has a '..' component");
  CHECK_FALSE(valid_relative_path("a/../../x", &why));
  CHECK_FALSE(valid_relative_path("/etc/passwd", &why));
  CHECK(why == "is absolute");
  CHECK_FALSE(valid_relative_path("a//b", &why));
  CHECK_FALSE(valid_relative_path("a/./b", &why));
  CHECK_FALSE(valid_relative_path(std::string("a\0b", 3), &why));
  CHECK_FALSE(valid_relative_path(".xmesh-sync/m/x", &why));
  CHECK(symlink_stays_inside("a/l", "../b", &why));
  CHECK(symlink_stays_inside("a/b/l", "../../c/./d", &why));
  CHECK_FALSE(symlink_stays_inside("a/l", "../../etc/passwd", &why));
  CHECK_FALSE(symlink_stays_inside("l", "/etc/passwd", &why));
  CHECK_FALSE(symlink_stays_inside("a/l", "x/../../../y", &why));

  auto refused = [](std::vector<Entry> entries) {
    Manifest m;
    m.entries = std::move(entries);
    m.sort();
    try {
      check_manifest(m);
    } catch (const PathError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Entry up = file_entry("../x", "boom");
  CHECK_THAT(refused({up}), Catch::Contains("'..'"));
  CHECK_THAT(refused({file_entry("/etc/cron.d/x", "boom")}), Catch::Contains("absolute"));
  Entry link;
  link.path = "l";
  link.type = EntryType::Symlink;
  link.target = "../../home";
  CHECK_THAT(refused({link}), Catch::Contains("outside the workspace"));
  // A path reaching through a symlink or a file of the same manifest.
  Entry into = file_entry("l/x", "boom");
  link.target = "sub";
  CHECK_THAT(refused({link, into, dir_entry("sub")}), Catch::Contains("is not a directory"));
  CHECK_THAT(refused({file_entry("nodir/x", "boom")}), Catch::Contains("is not in the manifest"));
  CHECK(refused({dir_entry("d"), file_entry("d/x", "ok")}).empty());
}

TEST_CASE("the receiver applies a tree, then only changes, and refuses malicious manifests", "[workspace]") {
  TempDir src, host;
  write(src.path + "/pkg/mod.py", "VALUE = 1\n");
  write(src.path + "/pkg/__init__.py", "");
  write(src.path + "/run.sh", "#!/bin/sh\necho hi\n");
  chmod((src.path + "/run.sh").c_str(), 0755);
  write(src.path + "/data/big.txt", std::string(100, 'z'));
  REQUIRE(symlink("pkg/mod.py", (src.path + "/alias.py").c_str()) == 0);
  SyncReceiver r(host.path + "/root", 60000);
  std::string root = host.path + "/root";

  json first = push_tree(r, src.path, "");
  CHECK(first["added"] == 5);
  CHECK(read(root + "/pkg/mod.py") == "VALUE = 1\n");
  CHECK(read(root + "/pkg/__init__.py").empty());
  struct stat st;
  REQUIRE(stat((root + "/run.sh").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);
  char target[64] = {0};
  REQUIRE(readlink((root + "/alias.py").c_str(), target, sizeof(target)) > 0);
  CHECK(std::string(target) == "pkg/mod.py");

  // No change: only the digest is compared.
  CHECK(push_tree(r, src.path, "", "cd34")["same"] == true);

  // Edit, delete, rename, chmod: the renamed file's content is found on the host (not asked for).
  write(src.path + "/pkg/mod.py", "VALUE = 2\n");
  make_dirs_path(root + "/pkg/__pycache__");
  write(root + "/pkg/__pycache__/mod.cpython-311.pyc", "stale bytecode");
  unlink((src.path + "/run.sh").c_str());
  rename((src.path + "/data/big.txt").c_str(), (src.path + "/data/moved.txt").c_str());
  chmod((src.path + "/pkg/__init__.py").c_str(), 0700);
  ScanResult s = scan_tree(src.path, {}, nullptr);
  r.handle({{"op", "begin"}, {"sid", "ef56"}, {"dest", ""}, {"digest", s.manifest.digest().hex()}}, {}, 0);
  auto plan = r.handle({{"op", "plan"}, {"sid", "ef56"}}, {s.manifest.encode_wire()}, 0);
  CHECK(plan.body["need"] == 1);  // only mod.py's new text travels
  r.handle({{"op", "abort"}, {"sid", "ef56"}}, {}, 0);
  CHECK(read(root + "/pkg/mod.py") == "VALUE = 1\n");  // aborted: nothing changed
  json second = push_tree(r, src.path, "", "ef57");
  CHECK(second["added"] == 1);
  CHECK(second["changed"] == 2);
  CHECK(second["deleted"] == 2);
  CHECK(read(root + "/pkg/mod.py") == "VALUE = 2\n");
  CHECK_FALSE(exists(root + "/pkg/__pycache__/mod.cpython-311.pyc"));  // no stale bytecode
  CHECK_FALSE(exists(root + "/run.sh"));
  CHECK_FALSE(exists(root + "/data/big.txt"));
  CHECK(read(root + "/data/moved.txt") == std::string(100, 'z'));
  REQUIRE(stat((root + "/pkg/__init__.py").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK_FALSE(exists(root + "/.xmesh-sync/stage/ef57"));

  // A hand edit on the host is seen at the next begin and repaired.
  write(root + "/pkg/mod.py", "VALUE = 666\n");
  json repaired = push_tree(r, src.path, "", "ab99");
  CHECK(repaired["changed"] == 1);
  CHECK(read(root + "/pkg/mod.py") == "VALUE = 2\n");

  // Malicious manifests: refused whole, nothing written outside (or inside) the copy.
  for (auto& bad : std::vector<std::vector<Entry>>{
           {file_entry("../escape.txt", "pwned")},
           {file_entry("/tmp/xmesh-absolute.txt", "pwned")},
           {[] {
             Entry l;
             l.path = "evil";
             l.type = EntryType::Symlink;
             l.target = "../../../../etc";
             l.size = l.target.size();
             return l;
           }()},
           {file_entry(".xmesh-sync/m/0000000000000000.manifest", "pwned")}}) {
    Manifest m;
    m.entries = bad;
    r.handle({{"op", "begin"}, {"sid", "bad0"}, {"dest", ""}, {"digest", m.digest().hex()}}, {}, 0);
    CHECK_THROWS_AS(r.handle({{"op", "plan"}, {"sid", "bad0"}}, {m.encode_wire()}, 0), PathError);
  }
  CHECK_FALSE(exists(host.path + "/escape.txt"));
  CHECK_FALSE(exists("/tmp/xmesh-absolute.txt"));
  CHECK_FALSE(exists(root + "/evil"));
  CHECK_THROWS_WITH(r.handle({{"op", "begin"}, {"sid", "bad1"}, {"dest", "../up"}, {"digest", ""}}, {}, 0),
                    Catch::Contains("refused destination"));
  // A symlink placed on the host where a directory is expected is not followed.
  remove_tree(root + "/data");
  REQUIRE(symlink(host.path.c_str(), (root + "/data").c_str()) == 0);
  CHECK_THROWS_WITH(push_tree(r, src.path, "", "ab98"), Catch::Contains("symlink or a file"));
  CHECK_FALSE(exists(host.path + "/moved.txt"));
}

TEST_CASE("the receiver checks every piece and refuses content that does not match", "[workspace][inv:protocol.2]") {
  TempDir src, host;
  write(src.path + "/a.txt", "hello world");
  SyncReceiver r(host.path, 60000);
  ScanResult s = scan_tree(src.path, {}, nullptr);
  r.handle({{"op", "begin"}, {"sid", "aa"}, {"dest", "w"}, {"digest", s.manifest.digest().hex()}}, {}, 0);
  r.handle({{"op", "plan"}, {"sid", "aa"}}, {s.manifest.encode_wire()}, 0);
  // Out of order (offset 3 first).
  CHECK_THROWS_WITH(r.handle({{"op", "data"}, {"sid", "aa"}, {"pieces", json::array({json::array({0, 3, 2, 2, 0})})}},
                             {std::string("lo")}, 0),
                    Catch::Contains("out of order"));
  // The failure dropped the session: the next step names it as unknown.
  CHECK_THROWS_WITH(r.handle({{"op", "commit"}, {"sid", "aa"}}, {}, 0), Catch::Contains("no sync session"));
  r.handle({{"op", "begin"}, {"sid", "bb"}, {"dest", "w"}, {"digest", s.manifest.digest().hex()}}, {}, 0);
  r.handle({{"op", "plan"}, {"sid", "bb"}}, {s.manifest.encode_wire()}, 0);
  CHECK_THROWS_WITH(r.handle({{"op", "commit"}, {"sid", "bb"}}, {}, 0), Catch::Contains("did not arrive"));
  r.handle({{"op", "begin"}, {"sid", "cc"}, {"dest", "w"}, {"digest", s.manifest.digest().hex()}}, {}, 0);
  r.handle({{"op", "plan"}, {"sid", "cc"}}, {s.manifest.encode_wire()}, 0);
  CHECK_THROWS_WITH(r.handle({{"op", "data"}, {"sid", "cc"}, {"pieces", json::array({json::array({0, 0, 11, 11, 0})})}},
                             {std::string("HELLO WORLD")}, 0),
                    Catch::Contains("does not match its manifest"));
  CHECK_FALSE(exists(host.path + "/w/a.txt"));
  // A step whose body does not read (runtime/protocol/bodies.hpp, SyncStepBody) is refused, naming why.
  CHECK_THROWS_WITH(r.handle({{"op", "data"}, {"sid", "cc"}, {"pieces", json::array({json::array({0, 1})})}}, {}, 0),
                    Catch::Contains("malformed sync request: Sync body: 'pieces' has the wrong type"));
  CHECK_THROWS_WITH(r.handle({{"op", "rewind"}, {"sid", "cc"}}, {}, 0), Catch::Contains("unknown step 'rewind'"));
  CHECK_THROWS_WITH(r.handle({{"sid", "cc"}}, {}, 0), Catch::Contains("Sync body without 'op'"));
  // Destinations must not nest.
  CHECK(push_tree(r, src.path, "w")["added"] == 1);
  CHECK_THROWS_WITH(push_tree(r, src.path, "w/inner"), Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(push_tree(r, src.path, ""), Catch::Contains("overlaps"));
  CHECK(push_tree(r, src.path, "w2")["added"] == 1);
}

// Issue 41, finding 6: a chain of links each lexically inside (d1/d2/d3/s -> ../../.., then
// e -> d1/d2/d3/s/../../../../outside) resolves outside on the host, since the kernel follows s
// before the '..' after it. A link whose target passes through another link is refused by the
// receiver and skipped by the scanner, naming why.
TEST_CASE("a link whose target passes through another link is refused and skipped, naming why", "[workspace]") {
  auto link_entry = [](const std::string& path, const std::string& target) {
    Entry l;
    l.path = path;
    l.type = EntryType::Symlink;
    l.target = target;
    l.size = target.size();
    return l;
  };
  Manifest m;
  m.entries = {dir_entry("d1"), dir_entry("d1/d2"), dir_entry("d1/d2/d3"), link_entry("d1/d2/d3/s", "../../.."),
               link_entry("e", "d1/d2/d3/s/../../../../outside")};
  m.sort();
  CHECK_THROWS_WITH(check_manifest(m), Catch::Contains("refused manifest entry 'e'") &&
                                           Catch::Contains("passes through the symlink 'd1/d2/d3/s'"));
  // Sent as a change to a manifest that had only the first link (a delta), it is refused the same.
  {
    TempDir host;
    SyncReceiver r(host.path, 60000);
    Manifest first = m;
    first.entries.pop_back();
    push_manifest(r, first, "c1");
    Manifest upserts;
    upserts.entries = {m.entries.back()};
    r.handle({{"op", "begin"}, {"sid", "c2"}, {"dest", ""}, {"digest", m.digest().hex()}}, {}, 0);
    CHECK_THROWS_WITH(r.handle({{"op", "plan"}, {"sid", "c2"}, {"base", first.digest().hex()}, {"digest", m.digest().hex()}},
                               {upserts.encode_wire(), Manifest().encode_wire()}, 0),
                      Catch::Contains("passes through the symlink"));
  }
  // And the other order: the link that turns an older one's target into an escape comes last.
  Manifest older;
  older.entries = {dir_entry("d1"), dir_entry("d1/d2"), link_entry("d1/d2/s", "x"),
                   link_entry("e", "d1/d2/s/../../../outside")};
  older.sort();
  std::string why;
  REQUIRE(symlink_resolves_inside(older, "e", "d1/d2/s/../../../outside", &why) == false);  // s is a link already
  Manifest plain;
  plain.entries = {dir_entry("d1"), dir_entry("d1/d2"), dir_entry("d1/d2/s"), link_entry("e", "d1/d2/s/../x")};
  plain.sort();
  CHECK_NOTHROW(check_manifest(plain));  // through real directories only: fine
  Manifest swapped = plain, change;
  swapped.entries[2] = link_entry("d1/d2/s", "../..");  // the directory replaced by a link to the root
  swapped.sort();
  change.entries = {swapped.entries[2]};
  CHECK_THROWS_WITH(check_manifest(swapped),
                    Catch::Contains("refused manifest entry 'e'") && Catch::Contains("passes through the symlink"));
  // A link to a link (its last component) is judged on its own.
  Manifest to_link;
  to_link.entries = {link_entry("a", "b"), link_entry("b", "c")};
  to_link.sort();
  CHECK_NOTHROW(check_manifest(to_link));

  TempDir t;
  write(t.path + "/d1/d2/d3/keep.txt", "k");
  REQUIRE(symlink("../../..", (t.path + "/d1/d2/d3/s").c_str()) == 0);
  REQUIRE(symlink("d1/d2/d3/s/../../../../outside", (t.path + "/e").c_str()) == 0);
  ScanResult r = scan_tree(t.path, {}, nullptr);
  CHECK(r.manifest.find("d1/d2/d3/s") != nullptr);  // itself inside
  CHECK(r.manifest.find("e") == nullptr);
  std::map<std::string, std::string> skipped(r.skipped.begin(), r.skipped.end());
  CHECK_THAT(skipped["e"], Catch::Contains("passes through the symlink 'd1/d2/d3/s'"));
}

TEST_CASE("the manifests kept for deltas are bounded by entries, not only by count", "[workspace]") {
  auto manifest_of = [](size_t entries, int version) {
    Manifest m;
    for (size_t i = 0; i < entries; ++i) m.entries.push_back(file_entry("f" + std::to_string(i), std::to_string(version)));
    return mapped_copy(m);
  };
  RecentManifests small(8, 100);
  for (int v = 0; v < 10; ++v) small.remember(Hash128{uint64_t(v), 0}, manifest_of(10, v));
  CHECK(small.size() == 8);  // 80 entries: the count bounds it
  CHECK(small.find(Hash128{9, 0}));
  CHECK(small.find(Hash128{2, 0}));
  CHECK_FALSE(small.find(Hash128{1, 0}));
  // Large trees: each version costs its entries, so only the newest and one older one stay
  // (the budget is twice the newest's).
  RecentManifests large(8, 100);
  for (int v = 0; v < 5; ++v) large.remember(Hash128{uint64_t(v), 1}, manifest_of(300, v));
  CHECK(large.size() == 2);
  CHECK(large.find(Hash128{4, 1}));
  CHECK(large.find(Hash128{3, 1}));
  // Remembering a digest again moves it to the front instead of keeping it twice.
  large.remember(Hash128{3, 1}, manifest_of(300, 3));
  CHECK(large.size() == 2);
  CHECK(large.find(Hash128{4, 1}));
  // One over the budget alone is still kept (the newest always is).
  RecentManifests tiny(8, 1);
  tiny.remember(Hash128{7, 7}, manifest_of(50, 0));
  CHECK(tiny.find(Hash128{7, 7}));
}
