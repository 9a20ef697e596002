// The receiver against what can change under it on the host: its own copy edited or replaced
// by a FIFO between the plan and the commit, its saved manifest replaced, and the agent
// stopping in the middle of a step.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workspace_helpers.hpp"

namespace {

// begin + plan of src's tree; returns the need list (16 bytes per object the host lacks).
std::string begin_and_plan(SyncReceiver& r, const std::string& src, const std::string& sid, Manifest& scanned) {
  scanned = scan_tree(src, {}, nullptr).manifest;
  auto begin = r.handle({{"op", "begin"}, {"sid", sid}, {"dest", ""}, {"digest", scanned.digest().hex()}}, {}, 0);
  REQUIRE_FALSE(begin.body.value("same", false));
  auto plan = r.handle({{"op", "plan"}, {"sid", sid}}, {scanned.encode_wire()}, 0);
  return plan.frames.at(0);
}

std::string commit_error(SyncReceiver& r, const std::string& sid) {
  try {
    r.handle({{"op", "commit"}, {"sid", sid}}, {}, 0);
  } catch (const SyncRefused& e) {
    return e.what();
  }
  return "(the commit succeeded)";
}

}  // namespace

TEST_CASE("content copied from the host's own copy is checked: an edit or a FIFO there fails the commit, naming it",
          "[workspace]") {
  TempDir src, host;
  const std::string root = host.path + "/root";
  write(src.path + "/a.txt", "hello world");
  SyncReceiver r(root, 60000);
  REQUIRE(push_tree(r, src.path, "")["added"] == 1);
  // A rename: b.txt's content is on the host (a.txt) and is not asked for; the commit copies it.
  REQUIRE(rename((src.path + "/a.txt").c_str(), (src.path + "/b.txt").c_str()) == 0);
  Manifest m;
  CHECK(begin_and_plan(r, src.path, "e1", m).empty());
  write(root + "/a.txt", "HELLO WORLD");  // a proc writes to it meanwhile (same size)
  std::string why = commit_error(r, "e1");
  CHECK(why.find("b.txt") != std::string::npos);
  CHECK(why.find("changed during the sync") != std::string::npos);
  CHECK_FALSE(exists(root + "/b.txt"));  // nothing switched in

  write(root + "/a.txt", "hello world");
  CHECK(begin_and_plan(r, src.path, "e2", m).empty());
  REQUIRE(unlink((root + "/a.txt").c_str()) == 0);
  REQUIRE(mkfifo((root + "/a.txt").c_str(), 0600) == 0);  // opened for reading, it would wait for a writer
  why = commit_error(r, "e2");
  CHECK(why.find("not a regular file") != std::string::npos);
  CHECK_FALSE(exists(root + "/b.txt"));

  // The next sync finds the FIFO (not a file of the manifest), and mends the copy.
  REQUIRE(unlink((root + "/a.txt").c_str()) == 0);
  json mended = push_tree(r, src.path, "", "e3");
  CHECK(mended["added"] == 1);
  CHECK(read(root + "/b.txt") == "hello world");
  CHECK_FALSE(exists(root + "/a.txt"));
}

TEST_CASE("a saved manifest that is not the one remembered is checked against the disk", "[workspace]") {
  TempDir src, host;
  const std::string root = host.path + "/root";
  write(src.path + "/keep.txt", "kept");
  write(src.path + "/pkg/mod.py", "V = 1\n");
  SyncReceiver r(root, 60000);
  REQUIRE(push_tree(r, src.path, "")["added"] == 2);
  // The manifest files are replaced behind the receiver's back (its watch covers the copy, not
  // its state directory): the next session must not trust them.
  for (const char* junk : {"not a manifest", ""}) {
    std::string dir = root + "/.xmesh-sync/m";
    bool found = false;
    for (auto* d = opendir(dir.c_str()); d;) {
      dirent* de = readdir(d);
      if (!de) {
        closedir(d);
        break;
      }
      std::string n = de->d_name;
      if (n.size() > 9 && n.compare(n.size() - 9, 9, ".manifest") == 0) {
        write(dir + "/" + n, junk);
        found = true;
      }
    }
    REQUIRE(found);
    write(src.path + "/pkg/mod.py", std::string("V = 2  # ") + junk + "\n");
    json after = push_tree(r, src.path, "", junk[0] ? "f1" : "f2");
    CHECK(after.value("changed", 0) + after.value("added", 0) >= 1);
    CHECK(read(root + "/pkg/mod.py") == std::string("V = 2  # ") + junk + "\n");
    CHECK(read(root + "/keep.txt") == "kept");
    Manifest now = r.verified_manifest("");
    CHECK(now.digest() == scan_tree(src.path, {}, nullptr).manifest.digest());
  }
}

TEST_CASE("a receiver cancelled mid-sync fails the step at hand and every later one, changing nothing", "[workspace]") {
  TempDir src, host;
  const std::string root = host.path + "/root";
  write(src.path + "/one.txt", "1");
  SyncReceiver r(root, 60000);
  REQUIRE(push_tree(r, src.path, "")["added"] == 1);
  write(src.path + "/two.txt", "22");
  Manifest m;
  std::string need = begin_and_plan(r, src.path, "c1", m);
  CHECK(need.size() == 16);
  r.cancel();  // the agent is stopping (SyncWorker's destructor)
  CHECK(commit_error(r, "c1").find("the host agent is stopping") != std::string::npos);
  CHECK_FALSE(exists(root + "/two.txt"));
  CHECK_THROWS_WITH(r.handle({{"op", "begin"}, {"sid", "c2"}, {"dest", ""}, {"digest", "00"}}, {}, 0),
                    Catch::Contains("the host agent is stopping"));
}

TEST_CASE("a hand edit of the host's copy is found by the next sync of the same tree", "[workspace]") {
  TempDir src, host;
  const std::string root = host.path + "/root";
  write(src.path + "/d1/a.txt", "hi\n");
  SyncReceiver r(root, 60000);
  REQUIRE(push_tree(r, src.path, "big", "a1")["added"] == 1);
  write(root + "/big/d1/a.txt", "hi\nmore\n");  // a proc writes into its copy
  json again = push_tree(r, src.path, "big", "a2");
  CHECK_FALSE(again.value("same", false));
  CHECK(again.value("changed", 0) == 1);
  CHECK(read(root + "/big/d1/a.txt") == "hi\n");
  CHECK(push_tree(r, src.path, "big", "a3")["same"] == true);
}
