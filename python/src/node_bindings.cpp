// xmesh._core: the node's face (runtime/node): calls and the one wait, the Node (its
// lifecycle, messages and supervision; data_bindings.cpp adds the data plane's methods).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "call.hpp"
#include "cast_trees.hpp"
#include "data_node.hpp"
#include "inbox.hpp"
#include "json_py.hpp"
#include "node.hpp"
#include "py_common.hpp"
#include "rdma_nic.hpp"
#include "waker.hpp"

// Calls and the one wait (runtime/node/call.hpp, waker.hpp).
void bind_calls(py::module_& m) {
  m.def("wake_main", []() { main_waker().notify(); },
        "Wakes the main thread's wait (output to show, a debugger stop); kept if nobody waits.");
  m.def("take_wake", []() { return main_waker().take(); }, "True if wake_main() came since the last take.");
  m.def("wake_fd", []() { return main_waker().fd(); }, "An fd readable while a wake_main() is pending.");
  py::class_<Call, std::shared_ptr<Call>>(m, "Call")
      .def_property_readonly("id", &Call::id)
      .def("__len__", &Call::size)
      .def_property_readonly("done", &Call::done)
      .def_property_readonly("received", &Call::received)
      .def_property_readonly("fatal", &Call::fatal)
      .def_property_readonly("is_port", &Call::is_port)
      .def("target_addr", &Call::target_addr)
      .def("wait", [](Call& c, const py::object& timeout) {
        return wait_sliced([&](int ms) { return c.wait_done(ms); }, opt_timeout(timeout));
      }, py::arg("timeout") = py::none())
      .def("wait_for", [](const std::shared_ptr<Call>& c, const py::object& timeout, bool any, bool wakeable) {
        // wakeable: the main thread's wait, which main_waker().notify() interrupts (Woken).
        struct Leave {
          bool on;
          ~Leave() { if (on) main_waker().leave(); }
        } leave{wakeable};
        if (wakeable) main_waker().enter(c);
        WaitOutcome out = WaitOutcome::Timeout;
        bool ended = wait_sliced([&](int ms) {
          out = c->wait_for(any, ms);
          return out != WaitOutcome::Timeout;
        }, opt_timeout(timeout));
        return ended ? out : WaitOutcome::Timeout;
      }, py::arg("timeout"), py::arg("any") = false, py::arg("wakeable") = false,
         "The one wait (see runtime/node/call.hpp wait_for): Ready, Woken or Timeout.")
      .def("take", [](Call& c) {
        py::list out;
        for (auto& r : c.take())
          out.append(py::make_tuple(r.index, r.ok, to_py(r.body.is_null() ? json::object() : r.body), frames_to_py(r.frames)));
        return out;
      })
      .def("missing", &Call::missing, "indexes of the targets that have not answered")
      .def("fail_all", [](Call& c, const py::object& err) { return c.fail_all(from_py(err)); })
      .def("cancel_all", [](Call& c, const py::object& err) { return c.cancel_all(from_py(err)); },
           "fails the targets that have not answered; they count as running until their own answer")
      .def("lingering", &Call::lingering, "indexes of cancelled targets whose own answer has not come")
      .def("running", &Call::running, "indexes of the targets still busy with the call (missing or lingering)")
      .def_property_readonly("settled", &Call::settled)
      .def("fileno", &Call::fd);
}

namespace {
void bind_node_stats(py::module_& m) {
  py::class_<NodeStats>(m, "NodeStats")
      .def_readonly("sent", &NodeStats::sent)
      .def_readonly("received", &NodeStats::received)
      .def_readonly("rejected", &NodeStats::rejected)
      .def_readonly("malformed", &NodeStats::malformed)
      .def_readonly("gaps", &NodeStats::gaps)
      .def_readonly("duplicates", &NodeStats::duplicates)
      .def_readonly("resent", &NodeStats::resent)
      .def_readonly("reconnects", &NodeStats::reconnects)
      .def_readonly("unacked", &NodeStats::unacked)
      .def_readonly("evicted", &NodeStats::evicted)
      .def_readonly("too_large", &NodeStats::too_large)
      .def_readonly("peers", &NodeStats::peers)
      .def_readonly("ring_sent", &NodeStats::ring_sent)
      .def_readonly("ring_received", &NodeStats::ring_received)
      .def_readonly("rings_out", &NodeStats::rings_out)
      .def_readonly("rings_in", &NodeStats::rings_in)
      .def_readonly("relayed", &NodeStats::relayed)
      .def_readonly("order_held", &NodeStats::order_held)
      .def_readonly("order_late", &NodeStats::order_late)
      .def_readonly("order_dropped", &NodeStats::order_dropped)
      .def_readonly("deferred", &NodeStats::deferred)
      .def_readonly("lane_sent", &NodeStats::lane_sent)
      .def_readonly("lane_received", &NodeStats::lane_received)
      .def_readonly("lanes_out", &NodeStats::lanes_out)
      .def_readonly("lanes_in", &NodeStats::lanes_in)
      .def_readonly("lane_breaks", &NodeStats::lane_breaks);
}

// The Node itself: made (with its data plane's part), started, stopped, its identity and cookies.
void bind_node_core(py::module_& m) {
  py::class_<Node, std::shared_ptr<Node>>(m, "Node")
      .def(py::init([](std::string role, std::string bind, std::string cookie, std::string key_file, std::string adv) {
             auto node = std::make_shared<Node>(role, bind, cookie, key_file, adv);
             // The data plane's owner side, and its RDMA NIC: the device the ibverbs probe finds
             // working, if any.
             DataNode::attach(*node).set_rdma_nic_source(&open_ibverbs_nic);
             CastTrees::attach(*node);  // calls past the fan-out go through trees; relays forward
             return node;
           }),
           py::arg("role"), py::arg("bind_addr"), py::arg("accept_cookie"), py::arg("key_file") = "",
           py::arg("advertise") = "")
      .def("listen_tcp",
           [](Node& n, const std::string& bind, const std::string& key_file, const std::string& advertise) {
             return n.transport().listen_tcp(bind, key_file, advertise);
           },
           py::arg("bind_addr"), py::arg("key_file"), py::arg("advertise") = "",
           "A second address on TCP (CURVE with the key file); returns it.")
      .def_property_readonly("tcp_addr", [](const Node& n) { return n.transport().tcp_addr(); })
      .def("retarget", &Node::retarget, py::arg("call"), py::arg("index"), py::arg("addr"))
      .def("start", &Node::start)
      .def("stop", &Node::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("id", &Node::id)
      .def_property_readonly("addr", &Node::addr)
      .def_property_readonly("incarnation", [](const Node& n) { return n.transport().self().incarnation; })
      .def_property_readonly("running", &Node::running)
      .def_property_readonly("max_message_bytes", [](const Node& n) { return n.transport().self().max_message_bytes; })
      .def("set_peer_cookie", [](Node& n, const std::string& addr, const std::string& cookie) {
        n.transport().cookies().present(addr, cookie);
      }, "The cookie to present when connecting to addr.")
      .def("set_default_cookie", [](Node& n, const std::string& cookie) {
        n.transport().cookies().present_by_default(cookie);
      }, "The cookie to present to a node no cookie was set for.")
      .def("add_accepted_cookie", [](Node& n, const std::string& cookie) { n.transport().cookies().accept(cookie); })
      .def("expect_listening", [](Node& n, const std::string& addr) { n.transport().expect_listening(addr); },
           py::arg("addr"),
           "The node at addr listens already (a host agent): failing to connect to it is a refusal at once.")
      .def("refuse_calls_from",
           [](Node& n, const std::string& addr, const py::object& err) { n.actors().refuse_from(addr, from_py(err)); });
}

// Messages: sends, calls, replies, ports, inboxes.
void bind_node_messages(py::module_& m) {
  node_class(m)
      .def("send", [](Node& n, const std::string& addr, int kind, const py::object& body, const py::object& frames,
                      const std::string& actor, const std::string& method, uint64_t corr, int64_t index,
                      const py::object& ctx, bool ok, bool wait) {
        Header h = make_header(kind, body, actor, method, corr, index, ctx);
        h.ok = ok;
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        if (wait)
          n.send(addr, std::move(h), std::move(fr));
        else
          n.send_if_ready(addr, std::move(h), std::move(fr));
      }, py::arg("addr"), py::arg("kind"), py::arg("body") = py::none(), py::arg("frames") = py::none(),
         py::arg("actor") = "", py::arg("method") = "", py::arg("corr") = 0, py::arg("index") = -1,
         py::arg("ctx") = py::none(), py::arg("ok") = false, py::arg("wait") = true,
         "Sends one message; wait=False: a link that cannot take it now raises at once instead of "
         "waiting up to XMESH_SEND_TIMEOUT_MS")
      .def("call", [](Node& n, const std::vector<std::pair<std::string, std::string>>& targets, int kind,
                      const std::string& method, const py::object& body, const py::object& frames, bool expect_reply,
                      const py::object& ctx) {
        Header h = make_header(kind, body, "", method, 0, -1, ctx);
        std::vector<Target> ts;
        ts.reserve(targets.size());
        for (auto& t : targets) ts.push_back({t.first, t.second});
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        return n.call(ts, std::move(h), std::move(fr), expect_reply);
      }, py::arg("targets"), py::arg("kind"), py::arg("method"), py::arg("body") = py::none(),
         py::arg("frames") = py::none(), py::arg("expect_reply") = true, py::arg("ctx") = py::none())
      .def("reply", [](Node& n, PyMessage& msg, bool ok, const py::object& body, const py::object& frames) {
        json b = from_py(body);
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        n.reply(msg.m, ok, std::move(b), std::move(fr));
      }, py::arg("msg"), py::arg("ok"), py::arg("body") = py::none(), py::arg("frames") = py::none())
      .def_property("cast_fanout", [](Node& n) { return CastTrees::of(n).fanout(); },
                    [](Node& n, size_t v) { CastTrees::of(n).set_fanout(v); },
                    "Calls to more targets on other hosts than this go through a cast tree (0 or 1: never); "
                    "XMESH_CAST_FANOUT at start.")
      .def_property("cast_local", [](Node& n) { return CastTrees::of(n).local(); },
                    [](Node& n, bool on) { CastTrees::of(n).set_local(on); },
                    "Whether this host's procs go through cast trees too (XMESH_CAST_TREE=all at start).")
      .def("expect", &Node::expect, py::call_guard<py::gil_scoped_release>())
      .def("open_port", &Node::open_port, py::arg("once") = false)
      .def("forget_call", &Node::forget_call)
      .def_property_readonly("control", [](Node& n) { return &n.control(); }, py::return_value_policy::reference_internal)
      .def_property_readonly("logs", [](Node& n) { return &n.logs(); }, py::return_value_policy::reference_internal)
      .def_property_readonly("actor_events", [](Node& n) { return &n.actor_events(); },
                             py::return_value_policy::reference_internal)
      .def("actor_inbox", [](Node& n, const std::string& name) { return n.actors().inbox(name); })
      .def(
          "remove_actor",
          [](Node& n, const std::string& name, const py::object& tombstone) {
            n.remove_actor(name, tombstone.is_none() ? json(nullptr) : from_py(tombstone));
          },
          py::arg("name"), py::arg("tombstone") = py::none())
      .def(
          "amend_tombstone",
          [](Node& n, const std::string& name, const py::object& tombstone) {
            return n.actors().amend_tombstone(name, from_py(tombstone));
          },
          py::arg("name"), py::arg("tombstone"),
          "Replaces what a removed actor's later messages are answered with; False: none was removed here.");
}

// Supervision: dead addresses, watched host agents, counters, what became of a link.
void bind_node_supervision(py::module_& m) {
  node_class(m)
      .def("mark_dead", [](Node& n, const std::string& addr, const py::object& err) { n.mark_dead(addr, from_py(err)); })
      .def("dead_reason", [](Node& n, const std::string& addr) -> py::object {
        json e;
        if (!n.supervision().is_dead(addr, &e)) return py::none();
        return to_py(e);
      })
      .def("revive", [](Node& n, const std::string& addr) { n.supervision().revive(addr); },
           "A new process now listens at addr (a host agent restarted): talk to it again.")
      .def("add_supervision_subscriber", [](Node& n, const std::string& addr) { n.supervision().subscribe(addr); })
      .def("remove_supervision_subscriber",
           [](Node& n, const std::string& addr) { n.supervision().unsubscribe(addr); })
      .def("watch_host",
           [](Node& n, const std::string& addr, int64_t pid, const std::string& host) {
             n.supervision().watch_host(addr, pid, host);
           },
           py::arg("hostd_addr"), py::arg("pid") = 0, py::arg("host") = "")
      .def(
          "host_state",
          [](const Node& n, const std::string& addr) -> py::object {
            auto st = n.supervision().host_state(addr);
            if (!st) return py::none();
            py::dict d;
            d["alive"] = st->alive;
            d["answering"] = st->answering;
            d["stopped"] = st->stopped;
            d["silent_ms"] = st->silent_ms;
            return d;
          },
          py::arg("hostd_addr"))
      .def("unwatch_host", [](Node& n, const std::string& addr) { n.supervision().unwatch_host(addr); })
      .def("add_dependent", [](Node& n, const std::string& host, const std::string& proc) {
        n.supervision().add_dependent(host, proc);
      })
      .def("lose_host", &Node::lose_host)
      .def("stats", &Node::stats)
      .def("link_report", [](const Node& n, const std::string& addr) { return n.transport().link_report(addr); },
           py::arg("addr"),
           "What became of this node's link to addr, in words (for a peer that does not answer).")
      .def("set_reach_back", [](Node& n, bool on) { n.transport().set_reach_back(on); }, py::arg("on"),
           "On: TCP peers dialled from now on reach this controller only through connections it opens to them "
           "(a controller the nodes cannot connect to). Needs listen_tcp first.")
      .def_property_readonly("reaches_back", [](const Node& n) { return n.transport().reaches_back(); })
      .def("reconnect", [](Node& n, const std::string& addr) { n.transport().disconnect(addr); }, py::arg("addr"),
           "The connection to addr is dropped with what it holds; the next send makes a new one (which says "
           "this node's Hello anew).")
      .def("expect_gone", [](Node& n, const std::string& addr) { n.transport().expect_gone(addr); },
           py::arg("addr"),
           "addr is ending on purpose (its proc is being stopped): no new TCP lane is proposed to it and its "
           "lanes' breaks are not said.")
      .def("reach_back_to", [](Node& n, const std::string& addr) { n.transport().reach_back_to(addr); },
           py::arg("addr"), py::call_guard<py::gil_scoped_release>(),
           "Opens back connections to addr now (a proc whose first message is to this controller).")
      .def("set_gateway", [](Node& n, const std::string& host_port) { n.transport().set_gateway(host_port); },
           py::arg("host_port"),
           "Every TCP connection this node opens from now on goes through the host agent at host_port "
           "(a controller outside the cluster reaching it through one port); \"\" for none.")
      .def("back_stats", [](const Node& n) {
        auto s = n.transport().back_stats();
        py::dict d;
        d["opened"] = s.dialer.opened;
        d["zmtp"] = s.dialer.zmtp;
        d["lanes"] = s.dialer.lanes;
        d["failed"] = s.dialer.failed;
        d["offered"] = s.pool.offered;
        d["refused"] = s.pool.refused;
        d["idle"] = s.pool.idle;
        d["joined"] = s.pool.joined;
        d["taken"] = s.pool.taken;
        return d;
      }, "Back connections: opened by this controller and used (zmtp, lanes) or failed; offered to this node, "
         "refused, idle, joined to its DEALERs, taken for lanes.");
}
}  // namespace

// The process's node (runtime/node/node.hpp).
void bind_node(py::module_& m) {
  bind_node_stats(m);
  bind_node_core(m);
  bind_node_messages(m);
  bind_node_supervision(m);
}
