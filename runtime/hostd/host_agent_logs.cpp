// The host agent's side of its procs' output (host_agent.hpp): what their pipes bring, split at
// markers into lines with the context of the call that printed them, written to the per-rank
// log files (rotated) and forwarded to the owning controller; and ReadLog, a controller reading
// those files.
#include "host_agent.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "node_bodies.hpp"
#include "output_bodies.hpp"
#include "sync_bodies.hpp"
#include "layout.hpp"
#include "log_record.hpp"
#include "util.hpp"
#include "process.hpp"
#include "tcp_endpoint.hpp"

namespace xmesh {

// A controller reads the per-rank log files kept here (they stay on this host): a listing of
// one log directory, or up to max_bytes of one of its files (procs.json or a rank's log).
void HostAgent::read_log(const Message& m) {
  ReadLogBody req;
  if (!read_request(m, req)) return;
  const std::string dir = layout::logs_root(opts_.runtime_dir) + (req.dir.empty() ? "" : "/" + req.dir);
  constexpr int64_t kMaxPiece = 16 << 20;
  ReadLogReply reply;
  if (req.file.empty()) {  // a listing: of the log directories, or of one's files
    DIR* d = opendir(dir.c_str());
    if (!d) return reply_error(m, "no log directory '" + req.dir + "' on " + hostname());
    while (dirent* de = readdir(d)) {
      std::string name = de->d_name;
      struct stat st {};
      if (name == "." || name == ".." || stat((dir + "/" + name).c_str(), &st) != 0) continue;
      if (req.dir.empty() ? S_ISDIR(st.st_mode) : (name == "procs.json" || layout::rank_log_of(name)))
        reply.files.push_back(LogFileEntry{name, req.dir.empty() ? 0 : static_cast<int64_t>(st.st_size)});
    }
    closedir(d);
    return node_->reply(m, true, reply, {});
  }
  if (req.file != "procs.json" && !layout::rank_log_of(req.file))
    return reply_error(m, "'" + req.file + "' is not a log file");
  unique_fd fd(open((dir + "/" + req.file).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return reply_error(m, "cannot read " + req.dir + "/" + req.file + " on " + hostname() + ": " + strerror(errno));
  struct stat st {};
  fstat(fd.get(), &st);
  reply.size = st.st_size;
  int64_t n = std::max<int64_t>(0, std::min<int64_t>({req.max_bytes, kMaxPiece, reply.size - req.offset}));
  zmq::message_t data(static_cast<size_t>(n));
  ssize_t got = n ? pread(fd.get(), data.data(), static_cast<size_t>(n), req.offset) : 0;
  if (got < 0) return reply_error(m, "cannot read " + req.dir + "/" + req.file + ": " + strerror(errno));
  std::vector<zmq::message_t> frames;
  frames.emplace_back(data.data(), static_cast<size_t>(got));
  node_->reply(m, true, reply, std::move(frames));
}

// Log records, one per line: "<epoch seconds>\t<flag>\t<actor>\t<text>\n", flag o/e (O/E when
// the text had no newline of its own: a partial line or a piece of a long one).
bool HostAgent::write_log(Proc& p, const Stream& s, const std::string& text) {
  if (!p.log) return true;
  double now = wall_time();
  size_t pos = 0, bytes = 0;
  bool written = true;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    bool whole = nl != std::string::npos;
    size_t end = whole ? nl : text.size();
    std::string record = format_record(now, s.flag, whole, s.ctx.actor, std::string_view(text).substr(pos, end - pos));
    written = fwrite(record.data(), 1, record.size(), p.log) == record.size() && written;
    bytes += record.size();
    p.log_bytes += static_cast<int64_t>(record.size());
    // The last lines, for the exit notice of a proc that dies.
    p.tail.push_back(text.substr(pos, std::min<size_t>(end - pos, 1000)));
    if (p.tail.size() > 20) p.tail.pop_front();
    pos = whole ? nl + 1 : end;
  }
  written = fflush(p.log) == 0 && written;
  if (!written) {  // a full disk, say: the lines are still forwarded; what the file lacks is counted
    if (p.log_error.empty()) p.log_error = std::strerror(errno ? errno : EIO);
    p.log_lost_bytes += bytes;
    clearerr(p.log);
  }
  if (p.log_bytes > opts_.log_max_bytes) rotate_log(p);
  return written;
}

// rank<r>.log -> rank<r>.log.1 -> ... -> rank<r>.log.<keep>; the oldest is dropped.
void HostAgent::rotate_log(Proc& p) {
  fclose(p.log);
  for (int i = opts_.log_keep; i >= 1; --i) {
    std::string from = i == 1 ? p.log_path : p.log_path + "." + std::to_string(i - 1);
    std::string to = p.log_path + "." + std::to_string(i);
    rename(from.c_str(), to.c_str());
  }
  if (opts_.log_keep < 1) unlink(p.log_path.c_str());
  p.log = fopen(p.log_path.c_str(), "we");
  p.log_bytes = 0;
}

// Sends text (whole lines, or a partial one) to the owning controller with the stream's
// current context, and the last marker passed (carries_news: send even without text, so the
// controller learns the new mark or the end of the stream).
void HostAgent::forward(LocalAllocation& a, Proc& p, Stream& s, const std::string& text, bool carries_news) {
  if (text.empty() && !carries_news) return;
  const bool first_loss = p.log_lost_bytes == 0;
  if (!write_log(p, s, text) && first_loss) {
    // Said once, in the output of the cell or program the lines go to; `xmesh logs` says it too.
    LogBody notice;
    notice.alloc = a.id;
    notice.rank = p.rank;
    notice.pid = p.pid;
    notice.stream = "stderr";
    notice.time = wall_time();
    notice.cell = s.ctx.cell;
    notice.mark = p.err.mark;  // no marker passed: the flush barrier is where it was
    Header nh;
    nh.kind = Kind::Log;
    nh.body = notice;
    std::string warn = "[xmesh] the log file " + p.log_path + " cannot be written (" + p.log_error +
                       "): its lines are shown but not kept; `xmesh logs` will say how much is missing\n";
    std::vector<zmq::message_t> wf;
    wf.emplace_back(warn.data(), warn.size());
    try {
      node_->send(a.controller_addr, std::move(nh), std::move(wf));
    } catch (const SendError&) {
    }
  }
  LogBody body;
  body.alloc = a.id;
  body.rank = p.rank;
  body.pid = p.pid;
  body.stream = s.name;
  body.time = wall_time();
  body.cell = s.ctx.cell;
  body.actor = s.ctx.actor;
  body.mark = s.mark;
  body.eof = !s.fd;
  std::vector<zmq::message_t> frames;
  frames.emplace_back(text.data(), text.size());
  try {
    node_->send(a.controller_addr, body, std::move(frames));
  } catch (const SendError&) {
    // The controller is gone; the log file keeps the lines.
  }
}

// Bytes read from a pipe: markers switch the context (and are passed on as the stream's mark
// after the text written before them); a partial line is released at a marker, so that what
// a call printed without a newline still arrives before its reply's barrier.
void HostAgent::consume(LocalAllocation& a, Proc& p, Stream& s, const char* data, size_t n) {
  std::vector<MarkerScanner::Piece> pieces;
  if (data) {
    s.scanner.feed(data, n, pieces);
  } else {
    s.scanner.finish(pieces);
  }
  int64_t now = now_ms();
  std::string batch;
  for (auto& piece : pieces) {
    if (!piece.is_marker) {
      for (auto& chunk : s.lines.feed(piece.text.data(), piece.text.size(), now)) {
        batch += chunk;
        if (chunk.back() != '\n') {  // a piece of a long line: a message of its own, open-ended
          forward(a, p, s, batch, false);
          batch.clear();
        }
      }
      continue;
    }
    batch += s.lines.flush_partial(now, -1);
    s.mark = piece.seq;
    forward(a, p, s, batch, true);
    batch.clear();
    s.ctx = std::move(piece.ctx);
  }
  forward(a, p, s, batch, false);
}

// End of a stream: the rest (a held-back marker prefix, a partial line) goes out, flagged eof.
void HostAgent::end_stream(LocalAllocation& a, Proc& p, Stream& s) {
  consume(a, p, s, nullptr, 0);
  s.fd.reset();
  forward(a, p, s, s.lines.flush_partial(now_ms(), -1), true);
}

void HostAgent::pump(Proc& p, Stream& s, LocalAllocation& a) {
  char buf[65536];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = read(s.fd.get(), buf, sizeof(buf));
    if (n > 0) {
      consume(a, p, s, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    end_stream(a, p, s);  // end of file (or error)
    return;
  }
}


}  // namespace xmesh
