#include "interrupts.hpp"

#include <Python.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <ctime>
#include <mutex>
#include <thread>

namespace xmesh::kernel {
namespace {

std::atomic<bool> g_executing{false};
pthread_t g_main_thread;
std::mutex g_handler_mutex;
std::function<void()> g_idle_handler;

sigset_t sigint_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  return s;
}

void watch_interrupts() {
  sigset_t s = sigint_set();
  for (;;) {
    siginfo_t info;
    if (sigwaitinfo(&s, &info) != SIGINT) continue;
    if (g_executing.load()) {
      pthread_kill(g_main_thread, SIGINT);
      continue;
    }
    std::lock_guard<std::mutex> lock(g_handler_mutex);
    if (g_idle_handler) g_idle_handler();
  }
}

}  // namespace

void install_interrupt_handling() {
  // A kernel may inherit SIGINT ignored (a Jupyter server started with `nohup ... &` passes it
  // on). An ignored signal is discarded even while blocked, so the watcher would never see it,
  // and Python installs its KeyboardInterrupt handler only over the default disposition: the
  // kernel takes its SIGINT back before either starts.
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) signal(SIGINT, SIG_DFL);
  sigset_t s = sigint_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  g_main_thread = pthread_self();
  std::thread(watch_interrupts).detach();
}

void set_idle_interrupt_handler(std::function<void()> handler) {
  std::lock_guard<std::mutex> lock(g_handler_mutex);
  g_idle_handler = std::move(handler);
}

ExecutingScope::ExecutingScope() {
  sigset_t s = sigint_set();
  timespec zero{0, 0};
  // A SIGINT still pending here came while no cell ran: it is an idle interrupt, which the
  // watcher thread had not picked up yet (a front end that interrupts, then at once runs a
  // cell). Dropping it would lose the "second interrupt cancels" the user asked for.
  int idle_interrupts = 0;
  while (sigtimedwait(&s, nullptr, &zero) == SIGINT) ++idle_interrupts;
  if (idle_interrupts) {
    std::lock_guard<std::mutex> lock(g_handler_mutex);
    if (g_idle_handler) g_idle_handler();
  }
  g_executing.store(true);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
}

ExecutingScope::~ExecutingScope() {
  sigset_t s = sigint_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  g_executing.store(false);
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyErr_CheckSignals() != 0) PyErr_Clear();
  PyGILState_Release(gil);
}

}  // namespace xmesh::kernel
