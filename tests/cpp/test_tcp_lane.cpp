// TCP lanes (runtime/transport/tcp_lane.hpp): records that seal and open whatever the cuts of the stream,
// what a changed, foreign or hostile byte does, messages over the limit, and the sockets: a
// listener taking only the tokens it gave, a writer held back by a reader that does not read.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "message_layout.hpp"
#include "tcp_lane.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {
struct Sample {
  std::vector<uint8_t> header;
  std::vector<std::string> frames;
  Header h;
};

Sample sample(uint64_t corr, std::vector<size_t> frame_sizes, std::mt19937& rng) {
  Sample s;
  s.h.kind = Kind::Call;
  s.h.corr = corr;
  s.h.sender = "writer";
  s.h.method = "m" + std::to_string(corr);
  s.header = encode_header(s.h);
  for (size_t n : frame_sizes) {
    std::string f(n, '\0');
    for (auto& c : f) c = static_cast<char>(rng());
    s.frames.push_back(std::move(f));
  }
  return s;
}

std::vector<zmq::message_t> frames_of(const Sample& s) {
  std::vector<zmq::message_t> out;
  for (auto& f : s.frames) out.emplace_back(f.data(), f.size());
  return out;
}

void seal(LaneSealer& sealer, const Sample& s, std::string& out) {
  auto frames = frames_of(s);
  sealer.seal(s.header, frames, out);
}

void check_same(const Message& m, const Sample& s) {
  CHECK(m.header.corr == s.h.corr);
  CHECK(m.header.method == s.h.method);
  REQUIRE(m.frames.size() == s.frames.size());
  for (size_t i = 0; i < s.frames.size(); ++i) CHECK(m.frames[i].to_string() == s.frames[i]);
}

// A plaintext laid out as a writer would, for a hand-made record.
std::string laid_out(const Sample& s) {
  auto frames = frames_of(s);
  LaidOut l(s.header, frames);
  std::string out;
  for (auto& p : l.parts) out.append(p);
  return out;
}
}  // namespace

TEST_CASE("lane records open into the messages sealed, however the stream is cut", "[tcp_lane]") {
  std::mt19937 rng(7);
  LaneSecret secret = make_lane_secret();
  REQUIRE(secret.key.size() == kLaneKeyBytes);
  REQUIRE(secret.token.size() == kLaneTokenBytes);
  CHECK(make_lane_secret().key != secret.key);
  LaneSealer sealer(secret.key);
  std::vector<Sample> sent;
  std::string stream;
  // Empty, small, exactly one record, one byte over, several records, many frames.
  std::vector<std::vector<size_t>> shapes = {{}, {1}, {kLaneChunk - 200}, {kLaneChunk}, {3 * kLaneChunk + 5},
                                             {10, 0, 70000, 3}, std::vector<size_t>(40, 100)};
  for (uint64_t i = 0; i < shapes.size() * 3; ++i) {
    sent.push_back(sample(i + 1, shapes[i % shapes.size()], rng));
    seal(sealer, sent.back(), stream);
  }
  LaneOpener opener(secret.key, 1 << 20);
  std::vector<Message> got;
  for (size_t at = 0; at < stream.size();) {
    size_t n = std::min<size_t>(stream.size() - at, 1 + rng() % 9000);
    opener.feed(stream.data() + at, n);
    at += n;
    Message m;
    std::string error;
    uint64_t payload = 0;
    LaneOpener::Got g;
    while ((g = opener.next(&m, &error, &payload)) == LaneOpener::Got::message) got.push_back(std::move(m));
    REQUIRE(g == LaneOpener::Got::nothing);
  }
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) check_same(got[i], sent[i]);
}

TEST_CASE("a lane record changed, foreign, replayed or malformed breaks the lane, saying why", "[tcp_lane]") {
  std::mt19937 rng(11);
  LaneSecret secret = make_lane_secret();
  LaneSealer sealer(secret.key);
  std::string stream;
  Sample s = sample(1, {5000}, rng);
  seal(sealer, s, stream);
  auto first = [&](const std::string& bytes, const std::string& key) {
    LaneOpener opener(key, 1 << 20);
    opener.feed(bytes.data(), bytes.size());
    Message m;
    std::string error;
    uint64_t payload = 0;
    auto g = opener.next(&m, &error, &payload);
    return std::make_pair(g, error);
  };
  REQUIRE(first(stream, secret.key).first == LaneOpener::Got::message);
  std::string changed = stream;
  changed[100] ^= 1;
  auto [g1, e1] = first(changed, secret.key);
  CHECK(g1 == LaneOpener::Got::broken);
  CHECK_THAT(e1, Catch::Contains("does not authenticate"));
  CHECK(first(stream, make_lane_secret().key).first == LaneOpener::Got::broken);  // another key
  auto [g2, e2] = first(stream + stream, secret.key);  // the same record again: its number is past
  CHECK(g2 == LaneOpener::Got::message);
  {
    LaneOpener opener(secret.key, 1 << 20);
    std::string twice = stream + stream;
    opener.feed(twice.data(), twice.size());
    Message m;
    std::string error;
    uint64_t payload = 0;
    CHECK(opener.next(&m, &error, &payload) == LaneOpener::Got::message);
    CHECK(opener.next(&m, &error, &payload) == LaneOpener::Got::broken);
    CHECK(opener.next(&m, &error, &payload) == LaneOpener::Got::broken);  // and stays so
  }
  std::string huge(4, '\0');
  uint32_t n = 1u << 30;
  std::memcpy(huge.data(), &n, 4);
  auto [g3, e3] = first(huge, secret.key);  // said at once, not waited for
  CHECK(g3 == LaneOpener::Got::broken);
  CHECK_THAT(e3, Catch::Contains("a record of 1073741824 bytes"));
}

TEST_CASE("records that open but do not make messages break the lane without big allocations", "[tcp_lane]") {
  std::mt19937 rng(13);
  LaneSecret secret = make_lane_secret();
  auto verdict = [&](const std::vector<std::string>& plains) {
    LaneSealer sealer(secret.key);
    std::string stream;
    for (auto& p : plains) sealer.seal_bytes(p, stream);
    LaneOpener opener(secret.key, 1 << 20);
    opener.feed(stream.data(), stream.size());
    Message m;
    std::string error;
    uint64_t payload = 0;
    LaneOpener::Got g;
    int messages = 0;
    while ((g = opener.next(&m, &error, &payload)) == LaneOpener::Got::message) ++messages;
    return std::make_pair(g, g == LaneOpener::Got::nothing ? std::to_string(messages) + " messages" : error);
  };
  std::string good = laid_out(sample(1, {100}, rng));
  CHECK(verdict({good, good}).second == "2 messages");
  CHECK(verdict({good.substr(0, 10)}).second == "a record that does not start a message");
  std::string header_huge = good;
  uint32_t four_gib = 0xffffffffu;
  uint64_t total = uint64_t(1) << 40;
  std::memcpy(&header_huge[0], &total, 8);
  std::memcpy(&header_huge[8], &four_gib, 4);
  CHECK_THAT(verdict({header_huge}).second, Catch::Contains("header and frame list take"));
  std::string too_short = good;  // its total says more than comes, then a new message starts
  uint64_t more = good.size() + 50;
  std::memcpy(&too_short[0], &more, 8);
  CHECK(verdict({too_short, good}).second == "a record past the end of a message");
  std::string bad_frame = good;  // a frame length past the end
  uint64_t past = 1 << 20;
  std::memcpy(&bad_frame[16], &past, 8);
  CHECK(verdict({bad_frame}).first == LaneOpener::Got::broken);
}

TEST_CASE("a message over the reader's limit is skipped with its header and size, the next one read", "[tcp_lane]") {
  std::mt19937 rng(17);
  LaneSecret secret = make_lane_secret();
  LaneSealer sealer(secret.key);
  std::string stream;
  Sample big = sample(1, {200000}, rng), small = sample(2, {10}, rng);
  seal(sealer, big, stream);
  seal(sealer, small, stream);
  LaneOpener opener(secret.key, 1000);
  opener.feed(stream.data(), stream.size());
  Message m;
  std::string error;
  uint64_t payload = 0;
  REQUIRE(opener.next(&m, &error, &payload) == LaneOpener::Got::too_large);
  CHECK(payload == 200000);
  CHECK(m.header.corr == 1);
  CHECK(m.frames.empty());
  REQUIRE(opener.next(&m, &error, &payload) == LaneOpener::Got::message);
  check_same(m, small);
}

namespace {
// Polls the listener until it hands over a lane (or nothing within a few seconds).
std::optional<LaneListener::Accepted> accept_one(LaneListener& l, std::vector<std::string>* refused) {
  for (int i = 0; i < 3000; ++i) {
    std::vector<int> fds;
    l.fds(fds);
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back(pollfd{fd, POLLIN, 0});
    ::poll(p.data(), p.size(), 1);
    auto got = l.poll(now_ms(), refused);
    if (!got.empty()) return std::move(got.front());
    if (refused && !refused->empty()) return std::nullopt;
  }
  return std::nullopt;
}

void wait_up(LaneWriter& w) {
  for (int i = 0; i < 5000 && w.state() == LaneWriter::State::connecting; ++i) usleep(1000);
  REQUIRE(w.state() == LaneWriter::State::up);
}

// Reads from `in` until `n` messages came (or the lane ends or 10 s pass).
LaneIn::Status read_n(LaneIn& in, std::vector<Message>& got, size_t n) {
  std::vector<LaneIn::TooLarge> too_large;
  std::string error;
  for (int i = 0; i < 10000 && got.size() < n; ++i) {
    pollfd p{in.fd(), POLLIN, 0};
    ::poll(&p, 1, 1);
    auto s = in.read(got, too_large, &error);
    if (s != LaneIn::Status::open) return s;
  }
  return LaneIn::Status::open;
}
}  // namespace

namespace {
// A listener on loopback and a writer connected to it ("tcp://writer:1"), the lane accepted.
struct ConnectedLane {
  LaneListener listener{"127.0.0.1", 0};
  LaneSecret secret = make_lane_secret();
  std::unique_ptr<LaneWriter> writer;
  std::optional<LaneListener::Accepted> accepted;
  std::vector<std::string> refused;
  ConnectedLane() {
    REQUIRE(listener.port() > 0);
    listener.expect(secret, "tcp://writer:1", now_ms(), 10000);
    writer = std::make_unique<LaneWriter>("127.0.0.1", listener.port(), secret);
    wait_up(*writer);
    accepted = accept_one(listener, &refused);
    REQUIRE(accepted);
  }
};
}  // namespace

TEST_CASE("a lane over a real socket carries messages in order from the token on", "[tcp_lane]") {
  std::mt19937 rng(19);
  ConnectedLane lane;
  LaneWriter& writer = *lane.writer;
  std::vector<Sample> sent;
  for (uint64_t i = 0; i < 200; ++i) sent.push_back(sample(i + 1, {i % 7 == 0 ? 150000 : i}, rng));
  CHECK(lane.refused.empty());
  CHECK(lane.accepted->writer_addr == "tcp://writer:1");
  LaneIn in(std::move(*lane.accepted), 1 << 20);
  std::thread reader_side;
  std::vector<Message> got;
  reader_side = std::thread([&] { read_n(in, got, sent.size()); });
  for (auto& s : sent) {
    auto frames = frames_of(s);
    REQUIRE(writer.write(s.header, frames, true, 10000) == LaneWriter::Result::ok);
  }
  reader_side.join();
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    check_same(got[i], sent[i]);
    CHECK(got[i].sender_addr == "tcp://writer:1");
  }
  writer.close();
  std::vector<Message> after;
  CHECK(read_n(in, after, 1) == LaneIn::Status::closed);
}

TEST_CASE("a lane listener takes only the tokens it gave, once, and drops the silent", "[tcp_lane]") {
  LaneListener listener("127.0.0.1", 0);
  LaneSecret given = make_lane_secret(), other = make_lane_secret();
  listener.expect(given, "tcp://a:1", now_ms(), 300);
  {
    LaneWriter stranger("127.0.0.1", listener.port(), other);
    wait_up(stranger);
    std::vector<std::string> refused;
    CHECK_FALSE(accept_one(listener, &refused));
    REQUIRE(refused.size() == 1);
    CHECK_THAT(refused[0], Catch::Contains("presented a token this node did not give"));
  }
  {
    LaneWriter first("127.0.0.1", listener.port(), given);
    wait_up(first);
    auto a = accept_one(listener, nullptr);
    REQUIRE(a);
    a->fd.reset();
    LaneWriter again("127.0.0.1", listener.port(), given);  // the same token a second time
    wait_up(again);
    std::vector<std::string> refused;
    CHECK_FALSE(accept_one(listener, &refused));
    REQUIRE(refused.size() == 1);
  }
  {
    // A connection that says nothing is closed once its time is up.
    int fd = -1;
    {
      addrinfo* res = nullptr;
      getaddrinfo("127.0.0.1", std::to_string(listener.port()).c_str(), nullptr, &res);
      fd = socket(AF_INET, SOCK_STREAM, 0);
      REQUIRE(connect(fd, res->ai_addr, res->ai_addrlen) == 0);
      freeaddrinfo(res);
    }
    std::vector<std::string> refused;
    CHECK_FALSE(accept_one(listener, &refused));
    REQUIRE(refused.size() == 1);
    CHECK_THAT(refused[0], Catch::Contains("did not present a token in time"));
    char c;
    CHECK(::recv(fd, &c, 1, 0) == 0);  // closed by the listener
    ::close(fd);
  }
}

TEST_CASE("a lane writer whose reader does not read is held back, loses nothing and never sends half", "[tcp_lane]") {
  std::mt19937 rng(23);
  ConnectedLane lane;
  LaneWriter& writer = *lane.writer;
  auto& accepted = lane.accepted;
  int small = 64 << 10;  // fixed buffers: the kernel does not grow them while the test fills them
  setsockopt(writer.fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(accepted->fd.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  LaneIn in(std::move(*accepted), 64 << 20);
  std::vector<Sample> sent;
  // Non-blocking writes until the socket's buffers are full: the last one taken stays pending,
  // the next is refused whole (would_block) and not sealed.
  LaneWriter::Result r = LaneWriter::Result::ok;
  for (uint64_t i = 0; i < 10000 && r == LaneWriter::Result::ok; ++i) {
    Sample s = sample(i + 1, {50000}, rng);
    auto frames = frames_of(s);
    r = writer.write(s.header, frames, false, 0);
    if (r == LaneWriter::Result::ok) sent.push_back(std::move(s));
  }
  REQUIRE(r == LaneWriter::Result::would_block);
  CHECK(writer.pending());
  Sample blocked = sample(99999, {10}, rng);
  auto frames = frames_of(blocked);
  CHECK(writer.write(blocked.header, frames, true, 50) == LaneWriter::Result::timed_out);  // committed
  sent.push_back(blocked);
  std::vector<Message> got;
  std::thread reader_side([&] { read_n(in, got, sent.size()); });
  CHECK(writer.flush(10000) == LaneWriter::Result::ok);
  reader_side.join();
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) CHECK(got[i].header.corr == sent[i].h.corr);
}

TEST_CASE("a lane writer learns its reader is gone", "[tcp_lane]") {
  ConnectedLane lane;
  LaneWriter& writer = *lane.writer;
  lane.accepted->fd.reset();
  Header h;
  h.sender = "w";
  std::vector<uint8_t> header = encode_header(h);
  LaneWriter::Result r = LaneWriter::Result::ok;
  for (int i = 0; i < 1000 && r == LaneWriter::Result::ok; ++i) {
    std::vector<zmq::message_t> none;
    r = writer.write(header, none, true, 1000);
    usleep(1000);
  }
  CHECK(r == LaneWriter::Result::broken);
  CHECK(writer.state() == LaneWriter::State::broken);
  CHECK_THAT(writer.error(), Catch::Contains("broke"));
  // Nothing listens: the connect fails, said.
  LaneWriter nowhere("127.0.0.1", lane.listener.port() == 1 ? 2 : 1, lane.secret);
  for (int i = 0; i < 5000 && nowhere.state() == LaneWriter::State::connecting; ++i) usleep(1000);
  CHECK(nowhere.state() == LaneWriter::State::broken);
  CHECK_THAT(nowhere.error(), Catch::Contains("connecting"));
}
