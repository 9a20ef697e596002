#include "history_manager.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <set>

namespace xmesh::kernel {

void HistoryManager::record_execution(int line, std::optional<std::string> output) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_ = Entry{line, "", std::move(output)};
}

void HistoryManager::store_inputs_impl(int /*session*/, int line, const std::string& input,
                                       const std::string& output) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry e{line, input, std::nullopt};
  if (!output.empty()) e.output = output;
  if (pending_) {
    e.line = pending_->line;
    if (pending_->output) e.output = std::move(pending_->output);
    pending_.reset();
  }
  entries_.push_back(std::move(e));
}

nl::json HistoryManager::entry_json(const Entry& e, bool output) const {
  if (!output) return nl::json::array({kSession, e.line, e.input});
  nl::json out = e.output ? nl::json(*e.output) : nl::json(nullptr);
  return nl::json::array({kSession, e.line, nl::json::array({e.input, out})});
}

nl::json HistoryManager::reply(nl::json history) {
  return nl::json{{"status", "ok"}, {"history", std::move(history)}};
}

nl::json HistoryManager::get_tail_impl(int n, bool /*raw*/, bool output) const {
  std::lock_guard<std::mutex> lock(mutex_);
  nl::json history = nl::json::array();
  size_t count = std::min(entries_.size(), static_cast<size_t>(std::max(n, 0)));
  for (size_t i = entries_.size() - count; i < entries_.size(); ++i) history.push_back(entry_json(entries_[i], output));
  return reply(std::move(history));
}

nl::json HistoryManager::get_range_impl(int session, int start, int stop, bool /*raw*/, bool output) const {
  std::lock_guard<std::mutex> lock(mutex_);
  nl::json history = nl::json::array();
  // Sessions other than this process's own have no entries (history is not kept across restarts).
  if (session != 0 && session != kSession) return reply(std::move(history));
  for (const Entry& e : entries_) {
    if (e.line >= start && (stop <= 0 || e.line < stop)) history.push_back(entry_json(e, output));
  }
  return reply(std::move(history));
}

nl::json HistoryManager::search_impl(const std::string& pattern, bool /*raw*/, bool output, int n,
                                     bool unique) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<const Entry*> matches;
  for (const Entry& e : entries_) {
    if (fnmatch(pattern.c_str(), e.input.c_str(), 0) == 0) matches.push_back(&e);
  }
  if (unique) {
    // Keep the latest entry of each distinct input, in order of those latest entries.
    std::set<std::string> seen;
    std::vector<const Entry*> latest;
    for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
      if (seen.insert((*it)->input).second) latest.push_back(*it);
    }
    matches.assign(latest.rbegin(), latest.rend());
  }
  if (n > 0 && matches.size() > static_cast<size_t>(n)) matches.erase(matches.begin(), matches.end() - n);
  nl::json history = nl::json::array();
  for (const Entry* e : matches) history.push_back(entry_json(*e, output));
  return reply(std::move(history));
}

}  // namespace xmesh::kernel
