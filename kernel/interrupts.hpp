// SIGINT in the xmesh kernel.
//
// xeus 2.4 dies on a SIGINT that arrives while it is idle (zmq::poll throws on EINTR), and
// jupyter_client sends one at the start of every shutdown and restart. So SIGINT is blocked in
// every thread from the start; a watcher thread takes each one with sigwaitinfo:
// - while a cell executes, the main thread accepts SIGINT (see ExecutingScope) and the watcher
//   forwards the signal to it, so Python's handler raises KeyboardInterrupt in the cell;
// - while the kernel is idle, the watcher calls the idle handler instead (the "second
//   interrupt", which cancels calls left running by an interrupted wait).
#pragma once
#include <functional>

namespace xmesh::kernel {

// Blocks SIGINT in the calling thread (and so in every thread it starts later) and starts the
// watcher. Call first thing in main(), before xeus or Python start threads.
void install_interrupt_handling();

// What an interrupt does while no cell executes. Runs on the watcher thread (or on the main
// thread, for one the watcher had not taken yet when a cell began); set to an empty function
// before the interpreter finalizes.
void set_idle_interrupt_handler(std::function<void()> handler);

// While alive, the calling (main) thread accepts SIGINT. A SIGINT still pending from before came
// while the kernel was idle: it runs the idle handler (it does not interrupt the new cell); one
// that tripped Python's handler too late to interrupt the cell is discarded at the end, so it
// never surfaces in the next request.
class ExecutingScope {
 public:
  ExecutingScope();
  ~ExecutingScope();
  ExecutingScope(const ExecutingScope&) = delete;
  ExecutingScope& operator=(const ExecutingScope&) = delete;
};

}  // namespace xmesh::kernel
