// Incremental workspace sync: the controller's watched rescan (scan_cache.hpp) must find exactly
// what a whole scan finds after every kind of edit, and a host must take a plan as a delta
// against its manifest, refusing deltas that do not fit or that would break path safety.
#include <catch2/catch.hpp>

#include <map>

#include <sys/stat.h>
#include <unistd.h>

#include <functional>

#include "path_safety.hpp"
#include "scan_cache.hpp"
#include "workspace_helpers.hpp"

namespace {

// One step of the edit script: what it does to the tree, by name (shown when a check fails).
struct Edit {
  const char* what;
  std::function<void(const std::string& root)> apply;
  bool whole = false;  // the rescan must look at everything (the root's own rules changed)
};

// One line per entry: path, type, content hash, link target, mode.
std::string listing(const Manifest& m) {
  std::string out;
  for (auto& e : m.entries)
    out += e.path + " " + char(e.type) + " " + e.hash.hex() + " " + e.target + " " + std::to_string(e.mode) + "\n";
  return out;
}

}  // namespace

TEST_CASE("a watched rescan finds what a whole scan finds, after every kind of edit", "[workspace]") {
  TempDir tree, state;
  std::string root = tree.path + "/ws";
  std::string cache = state.path + "/scan.manifest";
  for (int d = 0; d < 4; ++d)
    for (int f = 0; f < 5; ++f) write(root + "/pkg" + std::to_string(d) + "/sub/m" + std::to_string(f) + ".py", "x\n");
  write(root + "/top.py", "top\n");
  ScanOptions opts;
  opts.max_file_size = 1000;
  std::vector<Edit> edits = {
      {"nothing", [](const std::string&) {}},
      {"same size, same second", [](const std::string& r) { write(r + "/top.py", "TOP\n"); }},
      {"a new file deep down", [](const std::string& r) { write(r + "/pkg0/sub/new.py", "new\n"); }},
      {"a file deleted", [](const std::string& r) { unlink((r + "/pkg1/sub/m0.py").c_str()); }},
      {"a new directory filled at once",
       [](const std::string& r) {
         make_dirs_path(r + "/fresh/a/b");
         write(r + "/fresh/a/b/deep.py", "deep\n");
         write(r + "/fresh/x.py", "x\n");
       }},
      {"a directory renamed", [](const std::string& r) { rename((r + "/pkg2").c_str(), (r + "/fresh/pkg2").c_str()); }},
      {"a tree removed", [](const std::string& r) { remove_tree(r + "/pkg3"); }},
      {"a directory replaced by a file",
       [](const std::string& r) {
         remove_tree(r + "/pkg1/sub");
         write(r + "/pkg1/sub", "now a file\n");
       }},
      {"modes changed",
       [](const std::string& r) {
         chmod((r + "/top.py").c_str(), 0755);
         chmod((r + "/pkg0/sub").c_str(), 0700);
       }},
      {"a .gitignore hides a directory", [](const std::string& r) { write(r + "/fresh/.gitignore", "a/\n"); }},
      {"a file in the ignored directory", [](const std::string& r) { write(r + "/fresh/a/b/more.py", "more\n"); }},
      {"the .gitignore goes again", [](const std::string& r) { unlink((r + "/fresh/.gitignore").c_str()); }},
      {"symlinks in and out, a fifo",
       [](const std::string& r) {
         REQUIRE(symlink("../top.py", (r + "/pkg0/link.py").c_str()) == 0);
         REQUIRE(symlink("/etc/passwd", (r + "/pkg0/out").c_str()) == 0);
         REQUIRE(mkfifo((r + "/pkg0/pipe").c_str(), 0600) == 0);
       }},
      {"a file over the size limit", [](const std::string& r) { write(r + "/fresh/big.bin", std::string(2000, 'b')); }},
      {"bytecode written by Python", [](const std::string& r) { write(r + "/pkg0/__pycache__/m0.cpython-311.pyc", "pyc"); }},
      {"the large file and the fifo go", [](const std::string& r) {
         unlink((r + "/fresh/big.bin").c_str());
         unlink((r + "/pkg0/pipe").c_str());
       }},
      {"the root's .xmeshignore hides a tree", [](const std::string& r) { write(r + "/.xmeshignore", "pkg0/\n"); }, true},
      {"a file in the hidden tree", [](const std::string& r) { write(r + "/pkg0/sub/hidden.py", "h\n"); }},
  };
  ScanResult first = scan_cached(root, cache, opts, true);
  CHECK_FALSE(first.incremental);
  for (auto& edit : edits) {
    INFO("after: " << edit.what);
    edit.apply(root);
    ScanResult rescan = scan_cached(root, cache, opts, true);
    ScanResult whole = scan_tree(root, opts, nullptr);
    CHECK(rescan.incremental == !edit.whole);
    const Manifest m = rescan.file->load();
    CHECK(listing(m) == listing(whole.manifest));
    CHECK(m.digest() == whole.manifest.digest());
    CHECK(rescan.digest == whole.digest);
    CHECK(rescan.files == whole.files);
    CHECK(rescan.bytes == whole.bytes);
    CHECK(rescan.skipped == whole.skipped);
    CHECK(rescan.too_large == whole.too_large);
  }
  // Other options, or the root replaced by another directory: a whole scan again.
  ScanOptions other = opts;
  other.excludes = {"*.bin"};
  ScanResult r1 = scan_cached(root, cache, other, true);
  CHECK_FALSE(r1.incremental);
  rename(root.c_str(), (tree.path + "/old").c_str());
  write(root + "/only.py", "only\n");
  ScanResult r2 = scan_cached(root, cache, other, true);
  CHECK_FALSE(r2.incremental);
  CHECK(paths(r2.file->load()) == std::vector<std::string>{"only.py"});
  // Incremental scans turned off: every scan is whole.
  ScanResult r3 = scan_cached(root, cache, other, false);
  CHECK_FALSE(r3.incremental);
}

TEST_CASE("a rescan that would look at more than it may hold afresh is a whole scan", "[workspace]") {
  TempDir tree, state;
  const std::string root = tree.path + "/ws";
  for (int i = 0; i < 40; ++i) write(root + "/d" + std::to_string(i % 4) + "/f" + std::to_string(i) + ".py", "x\n");
  usleep(1100 * 1000);  // past the racy window: the next scans may reuse the first one's hashes
  ScanResult first = scan_tree_to(root, {}, nullptr, state.path + "/1.manifest");
  for (int i = 0; i < 12; ++i) write(root + "/d1/new" + std::to_string(i) + ".py", "n\n");
  write(root + "/d2/one.py", "1\n");
  ChangedDirs changes;
  changes.listed = {"d1", "d2"};
  // d1 holds 22 entries now (10 before), d2 11: a fresh look of 33 entries.
  ScanResult small = rescan_tree(root, {}, *first.file, first, changes, wall_ns(), state.path + "/2.manifest", 20);
  ScanResult roomy = rescan_tree(root, {}, *first.file, first, changes, wall_ns(), state.path + "/3.manifest", 40);
  ScanResult whole = scan_tree(root, {}, nullptr);
  CHECK_FALSE(small.incremental);
  CHECK(roomy.incremental);
  CHECK(small.digest == whole.digest);
  CHECK(roomy.digest == whole.digest);
  CHECK(listing(small.file->load()) == listing(whole.manifest));
  CHECK(listing(roomy.file->load()) == listing(whole.manifest));
  CHECK(roomy.hashed_files == 13);  // the new files; the listed directories' others by the racy rule
  CHECK(roomy.reused == 40);        // 20 of those, and d0's and d3's copied as they stream by
}

TEST_CASE("a watched rescan that saw no change gives the previous manifest itself, not a copy", "[workspace]") {
  TempDir tree;
  std::string root = tree.path + "/ws";
  for (int i = 0; i < 50; ++i) write(root + "/d" + std::to_string(i % 5) + "/f" + std::to_string(i) + ".py", "x\n");
  // (a tree never scanned has one more whole look: its directories are watched after the first)
  scan_cached(root, tree.path + "/scan.manifest", {}, true);
  ScanResult first = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  ScanResult second = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  CHECK(second.file.get() == first.file.get());  // a million-entry tree is neither written nor walked again
  CHECK(second.digest == first.digest);
  CHECK(second.incremental);
  CHECK(second.reused == 50);
  CHECK(second.hashed_files == 0);
  CHECK(second.watched_dirs == first.watched_dirs);
  write(root + "/d0/new.py", "n\n");
  ScanResult third = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  CHECK(third.file.get() != first.file.get());
  CHECK(third.file->load().find("d0/new.py"));
  CHECK(paths(first.file->load()).size() == 55);  // the earlier manifest stays as it was, mapped
}

TEST_CASE("the watch covers the directories a scan keeps, not ignored trees", "[workspace]") {
  TempDir tree;
  std::string root = tree.path + "/ws";
  write(root + "/.gitignore", ".venv/\n");
  write(root + "/src/pkg/m.py", "m\n");
  for (int i = 0; i < 30; ++i) write(root + "/.venv/lib/p" + std::to_string(i) + "/x.py", "x\n");
  ScanResult first = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  CHECK(first.watched_dirs == 3);  // the root, src, src/pkg
  write(root + "/.venv/lib/p0/y.py", "y\n");  // unwatched, and ignored anyway
  write(root + "/src/pkg/n.py", "n\n");
  ScanResult second = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  CHECK(second.incremental);
  CHECK(paths(second.file->load()) == std::vector<std::string>{".gitignore", "src", "src/pkg", "src/pkg/m.py", "src/pkg/n.py"});
  make_dirs_path(root + "/src/new");  // a new directory is watched from its creation on
  ScanResult third = scan_cached(root, tree.path + "/scan.manifest", {}, true);
  CHECK(third.incremental);
  CHECK(third.watched_dirs == 4);
  CHECK(third.file->load().find("src/new"));
}

TEST_CASE("only the trees scanned most recently keep their watch", "[workspace]") {
  TempDir base;
  std::vector<std::string> roots;
  for (int i = 0; i < 9; ++i) {  // one more than are watched
    roots.push_back(base.path + "/t" + std::to_string(i));
    write(roots.back() + "/f.py", "x\n");
  }
  auto scan = [&](int i) {
    return scan_cached(roots[i], roots[i] + ".manifest", {}, true).incremental;
  };
  for (int i = 0; i < 9; ++i) CHECK_FALSE(scan(i));
  CHECK(scan(8));        // still watched
  CHECK_FALSE(scan(0));  // its watch went to make room: a whole scan, which watches it again
  CHECK(scan(0));
}

namespace {
// The test's own oracle of what a host's manifest becomes with a delta (the host merges it part
// by part as it comes: receiver.cpp).
Manifest applied(const Manifest& base, const Delta& delta) {
  std::map<std::string, Entry> by_path;
  for (auto& e : base.entries) by_path[e.path] = e;
  for (auto& e : delta.deleted.entries) by_path.erase(e.path);
  for (auto& e : delta.upserts.entries) by_path[e.path] = e;
  Manifest out;
  for (auto& kv : by_path) out.entries.push_back(kv.second);
  return out;
}
}  // namespace

TEST_CASE("a manifest delta applied to its base gives the target", "[workspace]") {
  Manifest base, target;
  base.entries = {dir_entry("a"), file_entry("a/x.py", "1"), file_entry("a/y.py", "2"), dir_entry("b"),
                  file_entry("b/z.py", "3"), file_entry("top", "t")};
  target.entries = {dir_entry("a"), file_entry("a/x.py", "1 changed"), file_entry("a/new.py", "n"),
                    file_entry("b", "b is a file now"), file_entry("top", "t", 0755)};
  target.sort();
  Delta d = delta_of(base, target);
  CHECK(paths(d.upserts) == std::vector<std::string>{"a/new.py", "a/x.py", "b", "top"});
  CHECK(paths(d.deleted) == std::vector<std::string>{"a/y.py", "b/z.py"});
  Manifest got = applied(base, d);
  CHECK(got.digest() == target.digest());
  CHECK_NOTHROW(check_manifest(got));
}

TEST_CASE("a host takes a plan as a delta, falls back to the whole manifest, refuses unsafe deltas", "[workspace]") {
  TempDir src, host;
  write(src.path + "/pkg/mod.py", "VALUE = 1\n");
  write(src.path + "/pkg/util.py", "U = 1\n");
  write(src.path + "/run.sh", "echo\n");
  std::string root = host.path + "/root";
  SyncReceiver r(root, 60000);
  push_tree(r, src.path, "");
  Manifest base = scan_tree(src.path, {}, nullptr).manifest;

  write(src.path + "/pkg/mod.py", "VALUE = 2\n");
  unlink((src.path + "/run.sh").c_str());
  Manifest now = scan_tree(src.path, {}, nullptr).manifest;
  Delta d = delta_of(base, now);
  auto begin = r.handle({{"op", "begin"}, {"sid", "d1"}, {"dest", ""}, {"digest", now.digest().hex()}}, {}, 0);
  CHECK(begin.body["have"] == base.digest().hex());
  json delta_plan = {{"op", "plan"}, {"sid", "d1"}, {"base", base.digest().hex()}, {"digest", now.digest().hex()}};
  auto plan = r.handle(delta_plan, {d.upserts.encode_wire(), d.deleted.encode_wire()}, 0);
  CHECK(plan.body["need"] == 1);
  json done = send_and_commit(r, src.path, now, "d1", plan.frames.at(0));
  CHECK(done["changed"] == 1);
  CHECK(done["deleted"] == 1);
  CHECK(read(root + "/pkg/mod.py") == "VALUE = 2\n");
  CHECK_FALSE(exists(root + "/run.sh"));
  CHECK(push_tree(r, src.path, "", "d2")["same"] == true);  // the host's manifest is the target's

  // A delta against another base, or whose result is not the promised manifest: "send it whole".
  write(src.path + "/pkg/util.py", "U = 2\n");
  Manifest next = scan_tree(src.path, {}, nullptr).manifest;
  Delta d2 = delta_of(now, next);
  r.handle({{"op", "begin"}, {"sid", "d3"}, {"dest", ""}, {"digest", next.digest().hex()}}, {}, 0);
  auto wrong_base = r.handle({{"op", "plan"}, {"sid", "d3"}, {"base", base.digest().hex()}, {"digest", next.digest().hex()}},
                             {d2.upserts.encode_wire(), d2.deleted.encode_wire()}, 0);
  CHECK(wrong_base.body["full"] == true);
  auto wrong_digest = r.handle({{"op", "plan"}, {"sid", "d3"}, {"base", now.digest().hex()}, {"digest", base.digest().hex()}},
                               {d2.upserts.encode_wire(), d2.deleted.encode_wire()}, 0);
  CHECK(wrong_digest.body["full"] == true);
  auto whole = r.handle({{"op", "plan"}, {"sid", "d3"}}, {next.encode_wire()}, 0);
  CHECK(send_and_commit(r, src.path, next, "d3", whole.frames.at(0))["changed"] == 1);
  CHECK(read(root + "/pkg/util.py") == "U = 2\n");

  // Deltas whose result would break path safety are refused whole, even with a matching digest:
  // a directory deleted under its files, a directory turned into a symlink above them, an escape.
  Entry link;
  link.path = "pkg";
  link.type = EntryType::Symlink;
  link.target = ".";
  link.size = 1;
  Entry escape = link;
  escape.path = "evil";
  escape.target = "../../etc";
  escape.size = escape.target.size();
  for (auto& bad : std::vector<Delta>{{{}, {{dir_entry("pkg")}}}, {{{link}}, {}}, {{{escape}}, {}}}) {
    Manifest result = applied(next, bad);
    r.handle({{"op", "begin"}, {"sid", "d4"}, {"dest", ""}, {"digest", result.digest().hex()}}, {}, 0);
    CHECK_THROWS_AS(r.handle({{"op", "plan"}, {"sid", "d4"}, {"base", next.digest().hex()}, {"digest", result.digest().hex()}},
                             {bad.upserts.encode_wire(), bad.deleted.encode_wire()}, 0),
                    PathError);
  }
  CHECK(read(root + "/pkg/util.py") == "U = 2\n");
  CHECK_FALSE(exists(root + "/evil"));
}
