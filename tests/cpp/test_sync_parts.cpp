// Issue 41, finding 3 (bounded memory): a host takes a plan in parts, merged with its saved
// manifest through cursors over mapped files, finds its own content through a hash index on disk,
// and holds only the objects of parts whose data has not come.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "fs_ops.hpp"
#include "hash_index.hpp"
#include "manifest_file.hpp"
#include "receiver.hpp"
#include "scan.hpp"
#include "workspace_helpers.hpp"

namespace {
// A manifest's entries from..to as one plan part's wire form.
std::string part_of(const Manifest& m, size_t from, size_t to) {
  Manifest p;
  for (size_t i = from; i < to && i < m.entries.size(); ++i) p.entries.push_back(m.entries[i]);
  return p.encode_wire();
}

size_t hashes_in(const std::string& need) { return need.size() / 16; }

// Sends m to the receiver in parts of `per_part` entries with each part's data; returns the
// number of objects asked for in all and the commit's reply (with its frames).
std::pair<size_t, SyncReceiver::Reply> push_in_parts(SyncReceiver& r, const std::string& src, const Manifest& m,
                                                     const std::string& sid, size_t per_part) {
  auto begin = r.handle({{"op", "begin"}, {"sid", sid}, {"dest", ""}, {"digest", m.digest().hex()}}, {}, 0);
  REQUIRE_FALSE(begin.body.value("same", false));
  size_t asked = 0;
  const size_t parts = (m.entries.size() + per_part - 1) / per_part;
  for (size_t k = 0; k < parts; ++k) {
    auto plan = r.handle({{"op", "plan"}, {"sid", sid}, {"part", k}, {"last", k + 1 == parts}},
                         {part_of(m, k * per_part, (k + 1) * per_part)}, 0);
    asked += hashes_in(plan.frames.at(0));
    send_need(r, src, m, sid, plan.frames.at(0), k);
  }
  return {asked, r.handle({{"op", "commit"}, {"sid", sid}}, {}, 0)};
}

std::vector<std::string> nul_split(const std::string& frame) {
  std::vector<std::string> out;
  for (size_t at = 0; at < frame.size();) {
    size_t nul = frame.find('\0', at);
    out.push_back(frame.substr(at, nul - at));
    at = nul + 1;
  }
  return out;
}
}  // namespace

TEST_CASE("a plan in parts makes the copy a whole plan makes, asking each content once", "[workspace]") {
  TempDir src, host;
  for (int d = 0; d < 3; ++d)
    for (int f = 0; f < 5; ++f)
      write(src.path + "/d" + std::to_string(d) + "/f" + std::to_string(f) + ".py",
            f == 4 ? std::string("shared = 1\n") : "x = " + std::to_string(d * 10 + f) + "\n");
  write(src.path + "/empty.txt", "");
  write(src.path + "/zz/empty-too.txt", "");
  REQUIRE(symlink("d0/f0.py", (src.path + "/alias.py").c_str()) == 0);
  Manifest m = scan_tree(src.path, {}, nullptr).manifest;
  SyncReceiver r(host.path, 60000);
  auto [asked, done] = push_in_parts(r, src.path, m, "a1", 4);  // 6 parts
  CHECK(asked == 13);  // 15 files, the shared text (in three parts) asked once; empty files never
  CHECK(done.body["added"] == 18);
  CHECK(done.body["unchanged"] == 0);
  for (int d = 0; d < 3; ++d)
    for (int f = 0; f < 5; ++f) {
      std::string rel = "/d" + std::to_string(d) + "/f" + std::to_string(f) + ".py";
      CHECK(read(host.path + rel) == read(src.path + rel));
    }
  CHECK(read(host.path + "/zz/empty-too.txt").empty());
  char target[64] = {0};
  REQUIRE(readlink((host.path + "/alias.py").c_str(), target, sizeof(target)) > 0);
  CHECK(std::string(target) == "d0/f0.py");
  // The host's manifest is the source's: the next sync is only a digest.
  CHECK(push_tree(r, src.path, "", "a2")["same"] == true);
  CHECK_FALSE(exists(host.path + "/.xmesh-sync/stage/a1"));

  // A rename of every file to a new directory: all content is found on the host, none travels.
  rename((src.path + "/d1").c_str(), (src.path + "/moved").c_str());
  Manifest moved = scan_tree(src.path, {}, nullptr).manifest;
  auto [asked2, done2] = push_in_parts(r, src.path, moved, "a3", 3);
  CHECK(asked2 == 0);
  CHECK(done2.body["added"] == 5);
  CHECK(done2.body["deleted"] == 5);
  CHECK(read(host.path + "/moved/f2.py") == "x = 12\n");
  CHECK_FALSE(exists(host.path + "/d1"));
}

TEST_CASE("plan parts out of order, past the open-part limit or over the size limit are refused, naming why",
          "[workspace]") {
  TempDir src, host;
  for (int i = 0; i < 20; ++i) write(src.path + "/f" + std::to_string(100 + i) + ".txt", std::to_string(i));
  Manifest m = scan_tree(src.path, {}, nullptr).manifest;
  SyncReceiver r(host.path, 60000);
  auto begin = [&](const std::string& sid) {
    r.handle({{"op", "begin"}, {"sid", sid}, {"dest", ""}, {"digest", m.digest().hex()}}, {}, 0);
  };
  auto plan = [&](const std::string& sid, uint64_t part, bool last, size_t from, size_t to) {
    return r.handle({{"op", "plan"}, {"sid", sid}, {"part", part}, {"last", last}}, {part_of(m, from, to)}, 0);
  };
  begin("b1");
  CHECK_THROWS_WITH(plan("b1", 1, false, 0, 2), Catch::Contains("part 1 came before part 0"));
  begin("b2");
  plan("b2", 0, false, 0, 2);
  CHECK_THROWS_WITH(plan("b2", 2, false, 2, 4), Catch::Contains("part 2 came where part 1 was due"));
  begin("b3");
  plan("b3", 0, false, 0, 2);
  CHECK_THROWS_WITH(r.handle({{"op", "plan"}, {"sid", "b3"}, {"part", 1}, {"base", "00"}, {"digest", "00"}},
                             {part_of(m, 2, 4), Manifest().encode_wire()}, 0),
                    Catch::Contains("not of the same kind"));
  // Paths must go on rising from one part to the next.
  begin("b4");
  plan("b4", 0, false, 2, 4);
  CHECK_THROWS_WITH(plan("b4", 1, false, 0, 2), Catch::Contains("not sorted and unique"));
  // Parts whose data has not come: at most kMaxOpenParts, then the plan is refused.
  begin("b5");
  for (uint64_t k = 0; k < SyncReceiver::kMaxOpenParts; ++k) plan("b5", k, false, k, k + 1);
  CHECK_THROWS_WITH(plan("b5", SyncReceiver::kMaxOpenParts, false, 8, 9), Catch::Contains("still wait for their data"));
  // A commit before the last part; data for a part that asked for nothing.
  begin("b6");
  auto first = plan("b6", 0, false, 0, 2);
  send_need(r, src.path, m, "b6", first.frames.at(0), 0);
  CHECK_THROWS_WITH(r.handle({{"op", "data"}, {"sid", "b6"}, {"part", 0}, {"pieces", json::array({json::array({0, 0, 1, 1, 0})})}},
                             {std::string("0")}, 0),
                    Catch::Contains("asked for nothing more"));
  begin("b7");
  plan("b7", 0, false, 0, 2);
  CHECK_THROWS_WITH(r.handle({{"op", "commit"}, {"sid", "b7"}}, {}, 0), Catch::Contains("before the plan's last part"));
  // A part over the entry limit is refused before anything is reserved for it.
  Manifest huge;
  for (uint64_t i = 0; i <= SyncReceiver::kMaxPartEntries; ++i) huge.entries.push_back(dir_entry("d" + std::to_string(1000000 + i)));
  begin("b8");
  CHECK_THROWS_WITH(r.handle({{"op", "plan"}, {"sid", "b8"}, {"part", 0}, {"last", true}}, {huge.encode_wire()}, 0),
                    Catch::Contains("65537 entries (at most 65536)"));
  CHECK_FALSE(exists(host.path + "/f100.txt"));  // none of these syncs changed the copy
}

TEST_CASE("a delta in parts that does not fit at its end plans again whole, keeping the content that came",
          "[workspace]") {
  TempDir src, host;
  for (int i = 0; i < 12; ++i) write(src.path + "/m" + std::to_string(10 + i) + ".py", "v = 1\n");
  SyncReceiver r(host.path, 60000);
  push_tree(r, src.path, "", "c0");
  Manifest base = scan_tree(src.path, {}, nullptr).manifest;
  for (int i = 0; i < 12; i += 3) write(src.path + "/m" + std::to_string(10 + i) + ".py", "v = " + std::to_string(i) + "0\n");
  Manifest now = scan_tree(src.path, {}, nullptr).manifest;
  // The controller's delta in parts of two entries: the four changed files, no deletions.
  PlanParts parts(mapped_copy(now), mapped_copy(base), 2);
  std::vector<PlanPart> delta(2);
  REQUIRE(parts.next(delta[0]));
  REQUIRE(parts.next(delta[1]));
  PlanPart none;
  CHECK_FALSE(parts.next(none));
  CHECK(delta[0].entries == 2);
  CHECK_FALSE(delta[0].last);
  CHECK(delta[1].last);
  CHECK(Manifest::decode_wire(delta[1].frames.at(1)).entries.empty());
  r.handle({{"op", "begin"}, {"sid", "c1"}, {"dest", ""}, {"digest", now.digest().hex()}}, {}, 0);
  // Two delta parts promising a manifest they do not make: the last one's answer is "full".
  auto delta_part = [&](uint64_t k, bool last, const std::string& digest) {
    return r.handle({{"op", "plan"}, {"sid", "c1"}, {"part", k}, {"last", last}, {"base", base.digest().hex()},
                     {"digest", digest}},
                    {delta[k].frames.at(0), delta[k].frames.at(1)}, 0);
  };
  auto p0 = delta_part(0, false, base.digest().hex());
  CHECK(hashes_in(p0.frames.at(0)) == 2);
  send_need(r, src.path, now, "c1", p0.frames.at(0), 0);
  CHECK(delta_part(1, true, base.digest().hex()).body["full"] == true);
  // Whole, in one part: the two contents that came are staged already; only the others travel.
  auto whole = r.handle({{"op", "plan"}, {"sid", "c1"}}, {now.encode_wire()}, 0);
  CHECK(hashes_in(whole.frames.at(0)) == 2);
  json done = send_and_commit(r, src.path, now, "c1", whole.frames.at(0));
  CHECK(done["changed"] == 4);
  CHECK(done["unchanged"] == 8);
  for (int i = 0; i < 12; ++i) {
    std::string rel = "/m" + std::to_string(10 + i) + ".py";
    CHECK(read(host.path + rel) == read(src.path + rel));
  }
}

TEST_CASE("a commit's answer counts every change and names the first 1,000 of each and every .py path",
          "[workspace]") {
  TempDir src, host;
  for (int i = 0; i < 1200; ++i) write(src.path + "/f" + std::to_string(10000 + i) + (i % 2 ? ".py" : ".txt"), std::to_string(i));
  Manifest m = scan_tree(src.path, {}, nullptr).manifest;
  SyncReceiver r(host.path, 60000);
  auto [asked, done] = push_in_parts(r, src.path, m, "d1", 500);
  CHECK(asked == 1200);
  CHECK(done.body["added"] == 1200);
  REQUIRE(done.frames.size() == 4);
  auto added = nul_split(done.frames[0]);
  CHECK(added.size() == SyncReceiver::kReportPaths);
  CHECK(added.front() == "f10000.txt");
  CHECK(nul_split(done.frames[3]).size() == 600);  // every .py path: auto_reload needs each
  // Deleting them all: more removals than one 1 MiB block of the removal list when paths are long.
  std::string deep = "a-directory-with-a-long-name-to-make-long-paths/another-long-level";
  Manifest wide;
  wide.entries = {dir_entry("a-directory-with-a-long-name-to-make-long-paths"), dir_entry(deep)};
  for (int i = 0; i < 12000; ++i) wide.entries.push_back(dir_entry(deep + "/subdirectory-number-" + std::to_string(100000 + i)));
  wide.sort();
  json made = push_manifest(r, wide, "d2");
  CHECK(made["deleted"] == 1200);
  struct stat st;
  REQUIRE(stat((host.path + "/" + deep + "/subdirectory-number-111999").c_str(), &st) == 0);
  json gone = push_manifest(r, Manifest(), "d3");
  CHECK(gone["deleted"] == 0);  // directories are not counted, but every one is removed, deepest first
  CHECK_FALSE(exists(host.path + "/a-directory-with-a-long-name-to-make-long-paths"));
}

TEST_CASE("a hash index on disk finds each file of a manifest by its content", "[workspace]") {
  TempDir t;
  const std::string path = t.path + "/m.manifest";
  std::vector<Entry> entries;
  {
    CacheWriter w(path, 1);
    for (int i = 0; i < 30000; ++i) {
      Entry e = i % 10 == 0 ? dir_entry("p" + std::to_string(100000 + i))
                            : file_entry("p" + std::to_string(100000 + i), "content " + std::to_string(i % 20000));
      w.add(e);
      entries.push_back(e);
    }
    w.commit();
  }
  auto m = MappedManifest::open(path);
  REQUIRE(m);
  CHECK(m->count() == 30000);
  HashIndex index(m, t.path + "/index");
  CHECK(index.size() == 27000);
  for (size_t i = 1; i < entries.size(); i += 7) {
    if (entries[i].type != EntryType::File) continue;
    auto at = index.find(entries[i].hash);
    REQUIRE(at);
    CHECK(m->entry_at(*at).hash == entries[i].hash);  // one of the files with that content
  }
  CHECK_FALSE(index.find(hash_bytes("not in it", 9)));
  // A merge of two manifests walks every path once, with the entry of each side.
  Manifest a, b;
  a.entries = {dir_entry("a"), file_entry("a/x", "1"), file_entry("c", "3")};
  b.entries = {dir_entry("a"), file_entry("b", "2"), file_entry("c", "3!")};
  save_manifest_cache(t.path + "/a", a);
  save_manifest_cache(t.path + "/b", b);
  std::vector<std::string> walk;
  for (ManifestMerge mm(MappedManifest::open(t.path + "/a"), MappedManifest::open(t.path + "/b")); !mm.at_end(); mm.next())
    walk.push_back(std::string(mm.now() ? mm.now()->path : "-") + "|" + (mm.before() ? mm.before()->path : "-"));
  CHECK(walk == std::vector<std::string>{"a|a", "a/x|-", "-|b", "c|c"});
}
