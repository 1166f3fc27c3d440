// hccc network proxy on UCX (UCP API): one progress thread per process carries the FIFO slots and
// counters of the connections whose ends sit on different nodes (see hccc.runtime.net).
//
// The kernels keep their protocol. For a connection whose receiver is on another node, the
// sender's connection table points at a local mirror of the receiver's FIFO and `tail` word; for
// one whose sender is on another node, the receiver's table points at a local mirror of the
// sender's `head` word. The proxy watches those mirrors:
//   * a send mirror's tail moved from s to t: carry slots s..t-1 to the receiver, data before tail,
//     one of two ways, by the bytes a slot's message holds this call:
//     - small (at most the connection's am_bytes, which the receiver agreed to): one active message
//       per slot, header (connection, slot number) and data together; the receiver's proxy copies
//       the data into the slot, then publishes the tail with a release store (only as far as every
//       earlier slot has arrived too) and wakes the kernel threads sleeping on it (on_slot);
//     - large: put the slots into the receiver's registered FIFO, then (after a fence: every put
//       before it is complete at the target before any put after it) put the tail value t into the
//       receiver's control block;
//   * a receive mirror's head moved: the new head goes to the sender's control block (the credit;
//     the receiver had finished reading those slots before it posted it); a credit the sender
//     cannot be waiting for yet waits up to CREDIT_DELAY_NS so that a slot sent right after it
//     goes first;
//   * a host-segment mirror changed (the host's barrier words, call record, state, reason and the
//     heartbeat this thread stamps): it goes to every remote peer's mirror of this rank's segment.
// Credits into host memory (a sender in CPU emulation) and host segments travel as control
// messages (AM_CTRL), not puts: over a transport without RDMA (TCP) UCX emulates a put and the
// target acks it, and an ack on an endpoint that has failed meanwhile (the peer closed it while
// this process was stopped) is fatal inside UCX ("Endpoint timeout" in ucp_put_handler); a
// message needs no answer. Each peer's control messages carry a sequence number and are applied
// in that order (UCX does not promise that active messages keep their order), so that a credit
// posted before a barrier word lands before it, as the drain's flush makes puts do. Credits into
// device memory (a GPU sender) stay puts.
// A slot is sent only as far as the launch uses it: every region holds a 16-byte header and at
// most 16 + slice bytes of data, so a message costs max_cnt * min(region, 32 + slice) bytes, not a
// whole slot (hn_set_shape, per call, before the launch; read after the tail that shows a slot,
// so never the previous call's).
// drain: push everything pending, then a worker flush (remote completion of every put), so no put
// of a finished call can land after the host resets the counters for the next one; then the
// mirrors, sent counts and published tails start over (the kernel has finished: it has read
// every slot sent to it, so no slot message of this call is still coming), so the next call
// needs no reset.
// Peers: endpoints with peer error handling; a failed endpoint marks its peer failed (its
// connections are skipped from then on, the host reports the rank and its node).
// Memory per connection: one FIFO mirror (nslots slots) and nslots message headers on the sending
// side, two words and nslots arrival marks on the receiving side, and at most nslots+1
// outstanding operations.
// Threads: the worker is single-threaded; set-up calls run before hn_start, teardown after the
// thread has joined; in between the host talks to the thread through atomics only.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#include <climits>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define HN_API extern "C" __attribute__((visibility("default")))

namespace {

struct Peer {
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey[2] = {nullptr, nullptr};           // control block, slot block
  std::atomic<int> status{0};                        // 0 = fine, else a ucs_status_t
  uint64_t ctrl_sent = 0;       // control messages sent to the peer (the next one's number)
  uint64_t ctrl_next = 0;       // the number of the next control message from it to apply
};

// The header of a control message (AM_CTRL): a credit (the word at `addr`, a send's head in the
// receiver's memory, becomes `value`) or a host segment (the data: the sender's segment, for the
// receiver's mirror of it); `seq` orders a peer's control messages.
struct CtrlHdr {
  uint32_t kind;                // CTRL_CREDIT, CTRL_SEGMENT
  uint32_t sender;
  uint64_t seq;
  uint64_t addr, value;
};
enum : uint32_t { CTRL_CREDIT = 1, CTRL_SEGMENT = 2 };
static_assert(sizeof(CtrlHdr) == 32, "CtrlHdr layout");
// Control messages that arrived before an earlier one of their peer, kept until it comes: at most
// this many per process (each at most a host segment); past it, they are dropped and counted.
constexpr size_t CTRL_EARLY_MAX = 1024;
struct EarlyCtrl {
  CtrlHdr h;
  std::vector<char> data;
};

// The header of a slot's active message (AM_SLOT): which of the receiver's connections, which
// slot of this call, and where the data goes in it (nreg regions of reg_used bytes, reg_stride
// apart; nreg == 1: the data from the slot's start).
struct SlotHdr {
  uint32_t conn;                // the receiver's receive-connection index
  uint32_t sender;              // the sending rank
  uint64_t seq;                 // the slot's number in this call (tail after it: seq + 1)
  uint32_t nreg, reg_used;
  uint64_t reg_stride;
};
enum : unsigned { AM_SLOT = 1, AM_CTRL = 2 };
// (the diagnostics of net_ucx.py pack both headers as 32 bytes: "<IIQIIQ", "<IIQQQ")
static_assert(sizeof(SlotHdr) == 32, "SlotHdr layout");

struct SendConn {
  int peer;
  char* mslots;                 // local mirror of the receiver's FIFO
  uint64_t* mtail;              // local mirror of the receiver's tail
  uint64_t rslots, rtail;       // the receiver's FIFO and tail (remote addresses)
  uint64_t slot_bytes, nslots;
  uint64_t sent;                // slots carried so far this call
  uint32_t rconn;               // the receiver's index of this connection (AM header)
  uint64_t am_bytes;            // slot messages up to this size go as one active message
  std::vector<SlotHdr> hdr;     // one header per slot (read by UCX until the message has left)
  uint64_t* head = nullptr;     // this rank's head word of the send, where credits arrive as
                                // control messages (host memory; null: they arrive as puts)
};

// A receive connection whose sender is on another node, as the active-message path fills it: the
// real FIFO and tail of this rank; `arrived[k % nslots] == k + 1` once slot k's data is in place.
struct Inbound {
  bool used = false;
  int peer = -1;
  char* slots = nullptr;
  uint64_t* tail = nullptr;
  uint64_t slot_bytes = 0, nslots = 0;
  uint64_t published = 0;       // the tail this thread has published this call
  std::vector<uint64_t> arrived;
  long watch = -1;              // the watch on `tail`, if any
};

struct RecvConn {
  int peer;
  uint64_t* mhead;              // local mirror of the sender's head
  uint64_t rhead;               // the sender's head (remote address)
  uint64_t sent;                // the credit sent so far this call
  const uint64_t* tail;         // this rank's tail of the connection (what the sender published)
  uint64_t nslots;
  uint64_t since = 0;           // when an unsent credit was first seen (0: none)
  bool message = false;         // credits go as control messages (the sender's head: host memory)
};

// A word this process's kernels wait on that a remote peer writes (a receive FIFO's tail, a send's
// head), in host memory (CPU emulation). A put lands without the futex wake a local peer's post
// does, so the thread wakes the word's sleepers when it sees the value change.
struct Watch {
  uint64_t* word;
  uint64_t last;
};

// Diagnostics (hn_trace): what the thread did when, on CLOCK_MONOTONIC, so that a benchmark can
// split a message's latency into its steps. Off unless asked for.
struct TraceEv {
  uint64_t t_ns;
  uint32_t kind;                // TR_SEEN, TR_ISSUED, TR_DELIVERED
  uint32_t index;               // send connection (SEEN, ISSUED) or watched word (DELIVERED)
  uint64_t value;               // the tail put, or the watched word's new value
};
enum : uint32_t { TR_SEEN = 1, TR_ISSUED = 2, TR_DELIVERED = 3 };

struct Pending {
  void* req;
  void* owned;                  // a heap copy the put reads from, freed at completion
};

// A credit the sender is not waiting for yet waits this long for the slots this thread sends to
// go first (push).
constexpr uint64_t CREDIT_DELAY_NS = 3000;

struct Net {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_mem_h> mems;
  std::vector<Peer*> peers;     // by rank; nullptr for ranks reached by shared memory
  std::vector<SendConn> sends;
  std::vector<RecvConn> recvs;
  std::vector<Inbound> inbound; // by receive-connection index
  // this rank's host segment: sent to each remote peer's mirror of it (its mirrors, rank * seg_stride)
  char* seg = nullptr;
  uint64_t seg_len = 0, seg_stride = 0;
  int rank = 0;
  char* mirrors = nullptr;      // this rank's mirrors of the remote peers' segments (seg_stride apart)
  std::vector<char> seg_last;
  std::vector<EarlyCtrl> early; // control messages waiting for an earlier one of their peer
  uint64_t* beat = nullptr;     // heartbeat word inside the host segment
  std::vector<Pending> pending;
  void* flush_req = nullptr;
  bool flushing = false;
  std::thread th;
  std::atomic<int> stop{0};
  std::atomic<uint64_t> drain_req{0}, drain_done{0}, reset_req{0}, reset_done{0};
  std::atomic<uint64_t> region_bytes{0}, region_used{0}, max_cnt{1};
  std::atomic<uint64_t> bytes_put{0}, puts{0}, ams{0}, am_bytes{0}, accepted{0}, rejected{0};
  std::atomic<uint64_t> ctrls{0}, ctrl_bytes{0}, ctrl_rejected{0};
  uint64_t serving_drain = 0;
  int efd = -1;                 // the worker's event fd: network activity wakes an idle thread
  std::vector<std::pair<size_t, uint64_t>> tails;   // scratch of push(): (send conn, new tail)
  std::vector<Watch> watches;
  bool credit_waiting = false;  // a delayed credit is due (push): the thread does not sleep
  // A stop of the whole process (SIGSTOP, a debugger) longer than stall_ns, seen by the thread as a
  // gap between two of its polls: the peers gave up on this rank meanwhile (its heartbeat stopped)
  // and closed their endpoints, so what waits in the sockets must not be served: acking a put on
  // an endpoint its peer has closed is fatal inside UCX ("Endpoint timeout" in ucp_put_handler).
  // From then on the thread drives no more UCX work, drains and resets fail at once, and close
  // neither flushes nor progresses; stalled_ms says how long the gap was (0: never stalled).
  std::atomic<uint64_t> stall_ns{0}, stalled_ms{0};
  std::atomic<bool> tracing{false};
  std::mutex trace_mu;
  std::vector<TraceEv> trace;
  size_t trace_cap = 0;
};

void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  Peer* p = static_cast<Peer*>(arg);
  p->status.store(status == UCS_OK ? UCS_ERR_ENDPOINT_TIMEOUT : (int)status);
}

uint64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void trace(Net* n, uint32_t kind, size_t index, uint64_t value) {
  if (!n->tracing.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> g(n->trace_mu);
  if (n->trace.size() < n->trace_cap)
    n->trace.push_back(TraceEv{now_ns(), kind, (uint32_t)index, value});
}

bool peer_ok(Net* n, int peer) {
  Peer* p = n->peers[peer];
  return p && p->ep && p->status.load(std::memory_order_relaxed) == 0;
}

// What a nonblocking send returned: done at once (free `owned`), failed (free it, the peer's
// status records the first error), or under way (kept until reap() sees it complete).
void track(Net* n, Peer* p, ucs_status_ptr_t r, void* owned) {
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    free(owned);
    if (r != nullptr && p->status.load() == 0) p->status.store((int)UCS_PTR_STATUS(r));
    return;
  }
  n->pending.push_back(Pending{r, owned});
}

// One put; `owned` (may be null) is freed once UCX no longer reads it.
void put(Net* n, int peer, const void* buf, size_t len, uint64_t raddr, int which, void* owned) {
  Peer* p = n->peers[peer];
  ucp_request_param_t prm;
  prm.op_attr_mask = 0;
  ucs_status_ptr_t r = ucp_put_nbx(p->ep, buf, len, raddr, p->rkey[which], &prm);
  n->puts.fetch_add(1, std::memory_order_relaxed);
  n->bytes_put.fetch_add(len, std::memory_order_relaxed);
  track(n, p, r, owned);
}

// One slot as one active message: header and data (contiguous, or `iov` regions: a heap array
// freed at completion), eager only (no rendezvous: the receiver copies the data in the handler).
void am_slot(Net* n, int peer, const SlotHdr* hdr, const void* buf, size_t len, ucp_dt_iov_t* iov,
             size_t niov) {
  Peer* p = n->peers[peer];
  ucp_request_param_t prm;
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_AM_SEND_FLAG_EAGER;
  if (iov != nullptr) {
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = ucp_dt_make_iov();
  }
  ucs_status_ptr_t r = ucp_am_send_nbx(p->ep, AM_SLOT, hdr, sizeof(SlotHdr),
                                       iov != nullptr ? (const void*)iov : buf,
                                       iov != nullptr ? niov : len, &prm);
  n->ams.fetch_add(1, std::memory_order_relaxed);
  n->am_bytes.fetch_add(len, std::memory_order_relaxed);
  track(n, p, r, iov);
}

void wake(uint64_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// One control message to `peer`: header and `len` bytes of `data` in one heap block, freed once
// UCX no longer reads it.
void ctrl_msg(Net* n, int peer, uint32_t kind, uint64_t addr, uint64_t value, const void* data,
              size_t len) {
  Peer* p = n->peers[peer];
  char* block = static_cast<char*>(malloc(sizeof(CtrlHdr) + len));
  CtrlHdr* h = reinterpret_cast<CtrlHdr*>(block);
  *h = CtrlHdr{kind, (uint32_t)n->rank, p->ctrl_sent++, addr, value};
  if (len) memcpy(block + sizeof(CtrlHdr), data, len);
  ucp_request_param_t prm;
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t r = ucp_am_send_nbx(p->ep, AM_CTRL, h, sizeof(CtrlHdr),
                                       block + sizeof(CtrlHdr), len, &prm);
  n->ctrls.fetch_add(1, std::memory_order_relaxed);
  n->ctrl_bytes.fetch_add(sizeof(CtrlHdr) + len, std::memory_order_relaxed);
  track(n, p, r, block);
}

// Apply one control message of the peer whose turn it is: a credit into the head word of one of
// this rank's sends to that peer, a segment into this rank's mirror of the peer's; anything else
// (an address that is no such head, a segment of another size) is dropped and counted.
void apply_ctrl(Net* n, const CtrlHdr& h, const void* data, size_t length) {
  if (h.kind == CTRL_CREDIT && length == 0) {
    for (SendConn& c : n->sends) {
      if (c.peer != (int)h.sender || c.head == nullptr || (uint64_t)(uintptr_t)c.head != h.addr)
        continue;
      __atomic_store_n(c.head, h.value, __ATOMIC_RELEASE);
      wake(c.head);
      return;
    }
  } else if (h.kind == CTRL_SEGMENT && n->mirrors != nullptr && length == n->seg_len) {
    memcpy(n->mirrors + (uint64_t)h.sender * n->seg_stride, data, length);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return;
  }
  n->ctrl_rejected.fetch_add(1, std::memory_order_relaxed);
}

// A control message arrived (inside ucp_worker_progress, on the progress thread): applied if it
// is its peer's next one (then every kept one that follows it), kept if an earlier one is still
// to come, dropped (counted) if its number was applied already or it names no remote peer.
ucs_status_t on_ctrl(void* arg, const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
  Net* n = static_cast<Net*>(arg);
  CtrlHdr h;
  if (header_length != sizeof h || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    n->ctrl_rejected.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  memcpy(&h, header, sizeof h);
  Peer* p = h.sender < n->peers.size() ? n->peers[h.sender] : nullptr;
  if (p == nullptr || h.seq < p->ctrl_next || length > n->seg_stride) {
    n->ctrl_rejected.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  if (h.seq > p->ctrl_next) {
    if (n->early.size() >= CTRL_EARLY_MAX) {
      n->ctrl_rejected.fetch_add(1, std::memory_order_relaxed);
      return UCS_OK;
    }
    const char* d = static_cast<const char*>(data);
    n->early.push_back(EarlyCtrl{h, std::vector<char>(d, d + length)});
    return UCS_OK;
  }
  apply_ctrl(n, h, data, length);
  ++p->ctrl_next;
  for (bool more = true; more && !n->early.empty();) {
    more = false;
    for (size_t i = 0; i < n->early.size(); ++i) {
      EarlyCtrl& e = n->early[i];
      if (e.h.sender != h.sender || e.h.seq != p->ctrl_next) continue;
      apply_ctrl(n, e.h, e.data.data(), e.data.size());
      ++p->ctrl_next;
      n->early.erase(n->early.begin() + (long)i);
      more = true;
      break;
    }
  }
  return UCS_OK;
}

// A slot's active message arrived (inside ucp_worker_progress, on the progress thread): check it
// against the connection it names (a message that does not fit is dropped and counted), copy the
// data into the slot, then publish the tail as far as every slot before it has arrived (release:
// the bytes before the tail) and wake the kernel threads sleeping on it.
ucs_status_t on_slot(void* arg, const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
  Net* n = static_cast<Net*>(arg);
  SlotHdr h;
  if (header_length != sizeof h || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    n->rejected.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  memcpy(&h, header, sizeof h);
  Inbound* in = h.conn < n->inbound.size() ? &n->inbound[h.conn] : nullptr;
  bool ok = in != nullptr && in->used && (int)h.sender == in->peer && h.seq >= in->published &&
            h.seq - in->published < in->nslots && in->arrived[h.seq % in->nslots] != h.seq + 1;
  if (ok) {
    if (h.nreg <= 1) {
      ok = length <= in->slot_bytes;
    } else {
      ok = h.reg_used > 0 && h.reg_used <= h.reg_stride && h.reg_stride <= in->slot_bytes &&
           (uint64_t)h.nreg * h.reg_used == length &&
           (uint64_t)(h.nreg - 1) * h.reg_stride + h.reg_used <= in->slot_bytes;
    }
  }
  if (!ok) {
    n->rejected.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  char* slot = in->slots + (h.seq % in->nslots) * in->slot_bytes;
  if (h.nreg <= 1) {
    memcpy(slot, data, length);
  } else {
    for (uint32_t r = 0; r < h.nreg; ++r)
      memcpy(slot + r * h.reg_stride, static_cast<const char*>(data) + (uint64_t)r * h.reg_used,
             h.reg_used);
  }
  in->arrived[h.seq % in->nslots] = h.seq + 1;
  n->accepted.fetch_add(1, std::memory_order_relaxed);
  const uint64_t before = in->published;
  while (in->arrived[in->published % in->nslots] == in->published + 1) ++in->published;
  if (in->published != before) {
    __atomic_store_n(in->tail, in->published, __ATOMIC_RELEASE);
    wake(in->tail);
    if (in->watch >= 0) {
      n->watches[in->watch].last = in->published;
      trace(n, TR_DELIVERED, (size_t)in->watch, in->published);
    }
  }
  return UCS_OK;
}

void put_word(Net* n, int peer, uint64_t value, uint64_t raddr) {
  uint64_t* w = static_cast<uint64_t*>(malloc(sizeof(uint64_t)));
  *w = value;
  put(n, peer, w, sizeof(uint64_t), raddr, 0, w);
}

void reap(Net* n) {
  size_t j = 0;
  for (size_t i = 0; i < n->pending.size(); ++i) {
    Pending& q = n->pending[i];
    if (ucp_request_check_status(q.req) == UCS_INPROGRESS) {
      n->pending[j++] = q;
    } else {
      ucp_request_free(q.req);
      free(q.owned);
    }
  }
  n->pending.resize(j);
}

// Push what the kernel and the host published; true when something was put.
bool push(Net* n, bool force = false) {
  bool any = false;
  std::vector<std::pair<size_t, uint64_t>>& tails = n->tails;
  tails.clear();
  for (size_t i = 0; i < n->sends.size(); ++i) {
    SendConn& c = n->sends[i];
    const uint64_t t = __atomic_load_n(c.mtail, __ATOMIC_ACQUIRE);
    if (t <= c.sent || !peer_ok(n, c.peer)) continue;
    trace(n, TR_SEEN, i, t);
    // the launch's shape, read after the tail that shows its slots (acquire): the host set it
    // before the launch whose kernel published that tail, so it is this call's. Read before the
    // tail, it could be the previous call's (the host sets the shape and launches while this
    // thread is between the two reads): a large call's slots then went as the last small call's
    // regions, as messages, and the receiver read the rest of each slot stale.
    const uint64_t rb = n->region_bytes.load(std::memory_order_relaxed);
    const uint64_t ru = n->region_used.load(std::memory_order_relaxed);
    const uint64_t mc = n->max_cnt.load(std::memory_order_relaxed);
    // the bytes of a slot this launch uses: one contiguous run, or mc regions of ru bytes
    const bool whole = rb == 0 || ru >= rb || mc <= 1;
    uint64_t len = (rb == 0 || mc == 0) ? c.slot_bytes : (mc - 1) * rb + (ru < rb ? ru : rb);
    if (len > c.slot_bytes) len = c.slot_bytes;
    const uint64_t msg = whole ? len : mc * ru;
    if (msg <= c.am_bytes) {
      for (uint64_t k = c.sent; k < t; ++k) {
        const uint64_t off = (k % c.nslots) * c.slot_bytes;
        SlotHdr* h = &c.hdr[k % c.nslots];
        *h = SlotHdr{c.rconn, (uint32_t)n->rank, k, whole ? 1u : (uint32_t)mc,
                     whole ? 0u : (uint32_t)ru, whole ? 0 : rb};
        if (whole) {
          am_slot(n, c.peer, h, c.mslots + off, len, nullptr, 0);
        } else {
          ucp_dt_iov_t* iov = static_cast<ucp_dt_iov_t*>(malloc(mc * sizeof(ucp_dt_iov_t)));
          for (uint64_t r = 0; r < mc; ++r) iov[r] = ucp_dt_iov_t{c.mslots + off + r * rb, ru};
          am_slot(n, c.peer, h, nullptr, msg, iov, mc);
        }
      }
      c.sent = t;
      trace(n, TR_ISSUED, i, t);
      any = true;
      continue;
    }
    for (uint64_t k = c.sent; k < t; ++k) {
      const uint64_t off = (k % c.nslots) * c.slot_bytes;
      if (whole) {
        put(n, c.peer, c.mslots + off, len, c.rslots + off, 1, nullptr);
      } else {
        for (uint64_t r = 0; r < mc; ++r)
          put(n, c.peer, c.mslots + off + r * rb, ru, c.rslots + off + r * rb, 1, nullptr);
      }
    }
    c.sent = t;
    tails.emplace_back(i, t);
  }
  if (!tails.empty()) {
    ucp_worker_fence(n->worker);  // every slot above lands before any tail below
    for (auto& [i, t] : tails) {
      put_word(n, n->sends[i].peer, t, n->sends[i].rtail);
      trace(n, TR_ISSUED, i, t);
    }
    any = true;
  }
  n->credit_waiting = false;
  for (RecvConn& c : n->recvs) {
    const uint64_t h = __atomic_load_n(c.mhead, __ATOMIC_ACQUIRE);
    if (h <= c.sent || !peer_ok(n, c.peer)) continue;
    // delayed credit: unless the sender has used its whole window (it may be waiting for this
    // very credit), the credit waits up to CREDIT_DELAY_NS, so that a slot this thread is about
    // to send is not queued behind it
    if (!force && c.tail != nullptr &&
        __atomic_load_n(c.tail, __ATOMIC_ACQUIRE) < c.sent + c.nslots) {
      const uint64_t t = now_ns();
      if (c.since == 0) c.since = t;
      if (t - c.since < CREDIT_DELAY_NS) {
        n->credit_waiting = true;
        continue;
      }
    }
    c.since = 0;
    if (c.message) ctrl_msg(n, c.peer, CTRL_CREDIT, c.rhead, h, nullptr, 0);
    else put_word(n, c.peer, h, c.rhead);
    c.sent = h;
    any = true;
  }
  if (n->seg != nullptr) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (memcmp(n->seg, n->seg_last.data(), n->seg_len) != 0) {
      memcpy(n->seg_last.data(), n->seg, n->seg_len);
      for (size_t r = 0; r < n->peers.size(); ++r) {
        if (!peer_ok(n, (int)r)) continue;
        ctrl_msg(n, (int)r, CTRL_SEGMENT, 0, 0, n->seg_last.data(), n->seg_len);
      }
      any = true;
    }
  }
  return any;
}

// Wake the kernel threads sleeping on a watched word that a put has changed.
void wake_watched(Net* n) {
  for (Watch& w : n->watches) {
    const uint64_t v = __atomic_load_n(w.word, __ATOMIC_ACQUIRE);
    if (v == w.last) continue;
    w.last = v;
    trace(n, TR_DELIVERED, (size_t)(&w - n->watches.data()), v);
    wake(w.word);
  }
}

// The mirrors this rank's kernel writes and the counts of what was put, back to zero (between
// calls, once this rank's kernel has finished and its puts are complete).
void reset_local(Net* n) {
  for (SendConn& c : n->sends) { __atomic_store_n(c.mtail, 0, __ATOMIC_RELEASE); c.sent = 0; }
  for (RecvConn& c : n->recvs) {
    __atomic_store_n(c.mhead, 0, __ATOMIC_RELEASE);
    c.sent = 0;
    c.since = 0;
  }
  for (Watch& w : n->watches) w.last = __atomic_load_n(w.word, __ATOMIC_ACQUIRE);
  for (Inbound& in : n->inbound) {
    in.published = 0;
    std::fill(in.arrived.begin(), in.arrived.end(), 0);
  }
}

// Idle policy. After the last piece of work the thread keeps polling (mirrors and the worker)
// without giving the core away for SPIN_NS, then yields the core between polls until YIELD_NS,
// then sleeps in the worker's event fd (network activity wakes it at once) for at most SLEEP_NS
// per poll of the mirrors, LONG_SLEEP_NS once nothing has moved for LONG_IDLE_NS.
constexpr uint64_t SPIN_NS = 2000, YIELD_NS = 2000000, SLEEP_NS = 20000,
                   LONG_IDLE_NS = 1000000000, LONG_SLEEP_NS = 200000;

// True once the gap since the thread's last poll exceeds Net::stall_ns: records the gap in
// stalled_ms (the thread then serves nothing more). Otherwise moves last_poll to now.
bool stalled_since(Net* n, uint64_t& last_poll) {
  const uint64_t t = now_ns(), limit = n->stall_ns.load(std::memory_order_relaxed);
  if (limit != 0 && t - last_poll > limit) {
    n->stalled_ms.store((t - last_poll) / 1000000 + 1, std::memory_order_release);
    return true;
  }
  last_poll = t;
  return false;
}

void loop(Net* n) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);   // sleeps of 20 us, not 20 + the default 50 us
  uint64_t last_beat = 0, last_work = now_ns(), last_poll = last_work;
  while (!n->stop.load(std::memory_order_acquire)) {
    bool work = false;
    if (n->stalled_ms.load(std::memory_order_relaxed) != 0) {
      timespec ts{0, (long)LONG_SLEEP_NS};
      nanosleep(&ts, nullptr);     // stalled: nothing more is served (see Net::stall_ns)
      continue;
    }
    if (stalled_since(n, last_poll)) continue;
    const uint64_t rq = n->reset_req.load(std::memory_order_acquire);
    if (rq != n->reset_done.load(std::memory_order_relaxed)) {
      reset_local(n);                // between calls: no kernel runs
      n->reset_done.store(rq, std::memory_order_release);
    }
    const uint64_t now = now_ns();
    if (n->beat != nullptr && now / 1000000 - last_beat >= 100) {
      last_beat = now / 1000000;
      __atomic_store_n(n->beat, last_beat, __ATOMIC_RELEASE);
    }
    work |= push(n);
    // Checked again just before the worker is progressed: a stop that fell anywhere in this
    // iteration so far is seen before anything waiting in the sockets is served. Only a stop that
    // falls inside ucp_worker_progress itself escapes both checks.
    if (stalled_since(n, last_poll)) continue;
    if (ucp_worker_progress(n->worker) != 0) {
      work = true;
      wake_watched(n);
    }
    if (!n->pending.empty()) reap(n);
    const uint64_t dq = n->drain_req.load(std::memory_order_acquire);
    if (dq != n->drain_done.load(std::memory_order_relaxed)) {
      if (!n->flushing) {
        push(n, true);
        ucp_request_param_t prm;
        prm.op_attr_mask = 0;
        ucs_status_ptr_t r = ucp_worker_flush_nbx(n->worker, &prm);
        n->flush_req = UCS_PTR_IS_PTR(r) ? r : nullptr;
        n->flushing = true;
        n->serving_drain = dq;
        work = true;
      }
    }
    if (n->flushing) {
      bool done = n->flush_req == nullptr ||
                  ucp_request_check_status(n->flush_req) != UCS_INPROGRESS;
      if (done) {
        if (n->flush_req != nullptr) ucp_request_free(n->flush_req);
        n->flush_req = nullptr;
        if (n->pending.empty()) {
          n->flushing = false;
          reset_local(n);             // this rank's kernel has finished: its mirrors start over
          n->drain_done.store(n->serving_drain, std::memory_order_release);
        }
      }
    }
    if (work) {
      last_work = now;
      continue;
    }
    const uint64_t quiet = now - last_work;
    if (quiet < SPIN_NS) continue;
    if (quiet < YIELD_NS || n->efd < 0 || n->credit_waiting) {
      sched_yield();
    } else if (ucp_worker_arm(n->worker) == UCS_OK) {
      pollfd p{n->efd, POLLIN, 0};
      const uint64_t ns = quiet < LONG_IDLE_NS ? SLEEP_NS : LONG_SLEEP_NS;
      timespec ts{0, (long)ns};
      ppoll(&p, 1, &ts, nullptr);
    }
  }
}

}  // namespace

HN_API void* hn_create(int rank, int world, char* err, int errlen) {
  Net* n = new Net();
  n->rank = rank;
  n->peers.assign(world, nullptr);
  // The same for the TCP transport's own keepalive (idle 10 s, then probes every 2 s): on a loaded
  // 2-core host it still ended live peers' endpoints as timed out ("Endpoint timeout" in
  // ucp_put_handler, fatal inside UCX). Off unless the environment sets it (setenv does not
  // replace a value already there).
  setenv("UCX_TCP_KEEPIDLE", "inf", 0);
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st == UCS_OK && getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    // UCX's own keepalive marks a peer's endpoint failed when the peer is slow to answer (a
    // loaded host: many ranks on few cores); a put from that live peer then needs an ack on the
    // failed endpoint, which UCX treats as fatal and aborts the process. hccc notices dead or
    // stuck peers itself (closed sockets, its kernel and set-up timeouts), so the keepalive is
    // off unless the environment asks for it.
    ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf");
  }
  if (st == UCS_OK) {
    ucp_params_t prm;
    memset(&prm, 0, sizeof prm);
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&prm, cfg, &n->ctx);
    ucp_config_release(cfg);
  }
  if (st == UCS_OK) {
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(n->ctx, &wp, &n->worker);
  }
  if (st == UCS_OK) {
    ucp_am_handler_param_t ap;
    memset(&ap, 0, sizeof ap);
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ap.id = AM_SLOT;
    ap.flags = UCP_AM_FLAG_WHOLE_MSG;
    ap.cb = on_slot;
    ap.arg = n;
    st = ucp_worker_set_am_recv_handler(n->worker, &ap);
    if (st == UCS_OK) {
      ap.id = AM_CTRL;
      ap.cb = on_ctrl;
      st = ucp_worker_set_am_recv_handler(n->worker, &ap);
    }
  }
  if (st != UCS_OK) {
    snprintf(err, errlen, "%s", ucs_status_string(st));
    if (n->worker) ucp_worker_destroy(n->worker);
    if (n->ctx) ucp_cleanup(n->ctx);
    delete n;
    return nullptr;
  }
  return n;
}

// The worker's address (what a peer needs to connect): copied into buf; returns its length, or
// -1 if it does not fit.
HN_API long hn_address(void* h, char* buf, long cap) {
  Net* n = static_cast<Net*>(h);
  ucp_address_t* a = nullptr;
  size_t len = 0;
  if (ucp_worker_get_address(n->worker, &a, &len) != UCS_OK) return -1;
  long out = (long)len <= cap ? (long)len : -1;
  if (out > 0) memcpy(buf, a, len);
  ucp_worker_release_address(n->worker, a);
  return out;
}

// Register [ptr, ptr+len) for remote access; the packed remote key into buf; returns its length
// (-1: failure or buf too small).
HN_API long hn_register(void* h, void* ptr, uint64_t len, char* buf, long cap) {
  Net* n = static_cast<Net*>(h);
  ucp_mem_map_params_t mp;
  memset(&mp, 0, sizeof mp);
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = ptr;
  mp.length = len;
  ucp_mem_h memh;
  if (ucp_mem_map(n->ctx, &mp, &memh) != UCS_OK) return -1;
  n->mems.push_back(memh);
  if (buf == nullptr) return 0;
  void* packed = nullptr;
  size_t size = 0;
  if (ucp_rkey_pack(n->ctx, memh, &packed, &size) != UCS_OK) return -1;
  long out = (long)size <= cap ? (long)size : -1;
  if (out > 0) memcpy(buf, packed, size);
  ucp_rkey_buffer_release(packed);
  return out;
}

// Connect to `peer` (its worker address) and unpack its two remote keys (control block, slot block); 0 or a ucs_status_t.
HN_API int hn_connect(void* h, int peer, const char* addr, const char* k0, const char* k1) {
  Net* n = static_cast<Net*>(h);
  Peer* p = new Peer();
  n->peers[peer] = p;
  ucp_ep_params_t ep;
  memset(&ep, 0, sizeof ep);
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(addr);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_error;
  ep.err_handler.arg = p;
  ucs_status_t st = ucp_ep_create(n->worker, &ep, &p->ep);
  if (st != UCS_OK) { p->ep = nullptr; return (int)st; }
  const char* keys[2] = {k0, k1};
  for (int i = 0; i < 2; ++i) {
    st = ucp_ep_rkey_unpack(p->ep, keys[i], &p->rkey[i]);
    if (st != UCS_OK) return (int)st;
  }
  return 0;
}

// A send to a remote receiver: its FIFO mirror and tail mirror here, the receiver's FIFO and tail
// there, and the receiver's index of the connection; slot messages of at most am_bytes go as one
// active message each (0: always puts); `head`: this rank's head word of the send, where the
// receiver's credits arrive as control messages (host memory; null: as puts).
HN_API void hn_add_send(void* h, int peer, void* mslots, void* mtail, uint64_t rslots,
                        uint64_t rtail, uint64_t slot_bytes, uint64_t nslots, uint32_t rconn,
                        uint64_t am_bytes, void* head) {
  Net* n = static_cast<Net*>(h);
  n->sends.push_back(SendConn{peer, static_cast<char*>(mslots), static_cast<uint64_t*>(mtail),
                              rslots, rtail, slot_bytes, nslots, 0, rconn, am_bytes,
                              std::vector<SlotHdr>(nslots), static_cast<uint64_t*>(head)});
}

// A receive from a remote sender that may come as active messages: this rank's FIFO (nslots
// slots of slot_bytes) and tail word of receive connection `conn`.
HN_API void hn_add_inbound(void* h, uint32_t conn, int peer, void* slots, uint64_t slot_bytes,
                           uint64_t nslots, void* tail) {
  Net* n = static_cast<Net*>(h);
  if (n->inbound.size() <= conn) n->inbound.resize(conn + 1);
  Inbound& in = n->inbound[conn];
  in.used = nslots > 0;
  in.peer = peer;
  in.slots = static_cast<char*>(slots);
  in.tail = static_cast<uint64_t*>(tail);
  in.slot_bytes = slot_bytes;
  in.nslots = nslots;
  in.published = 0;
  in.arrived.assign(nslots, 0);
}

// A word of this process's memory that a remote peer's puts change and local kernel threads may
// sleep on (CPU emulation: a futex); the thread wakes them when it sees it change.
HN_API void hn_add_watch(void* h, void* word) {
  Net* n = static_cast<Net*>(h);
  n->watches.push_back(Watch{static_cast<uint64_t*>(word), 0});
}

// A receive from a remote sender: the mirror of its head here, its head there, and this rank's
// tail word of the connection with the FIFO's depth (null: credits never wait); `message`: the
// head is host memory that the sender's proxy writes (credits as control messages, not puts).
HN_API void hn_add_recv(void* h, int peer, void* mhead, uint64_t rhead, void* tail,
                        uint64_t nslots, int message) {
  Net* n = static_cast<Net*>(h);
  n->recvs.push_back(RecvConn{peer, static_cast<uint64_t*>(mhead), rhead, 0,
                              static_cast<const uint64_t*>(tail), nslots, 0, message != 0});
}

// This rank's host segment: its first `len` bytes go to every remote peer's mirror; the proxy
// stamps `beat` (an offset into it) with its clock every 100 ms. `mirrors`: this rank's mirrors
// of the peers' segments (`stride` bytes per rank), where their segments arrive.
HN_API void hn_set_segment(void* h, void* seg, uint64_t len, uint64_t stride, uint64_t beat_off,
                           void* mirrors) {
  Net* n = static_cast<Net*>(h);
  n->mirrors = static_cast<char*>(mirrors);
  n->seg = static_cast<char*>(seg);
  n->seg_len = len;
  n->seg_stride = stride;
  n->seg_last.assign(len, 0);
  n->beat = reinterpret_cast<uint64_t*>(n->seg + beat_off);
}

HN_API void hn_set_shape(void* h, uint64_t region_bytes, uint64_t region_used, uint64_t max_cnt) {
  Net* n = static_cast<Net*>(h);
  n->region_bytes.store(region_bytes);
  n->region_used.store(region_used);
  n->max_cnt.store(max_cnt);
}

HN_API void hn_start(void* h) {
  Net* n = static_cast<Net*>(h);
  if (ucp_worker_get_efd(n->worker, &n->efd) != UCS_OK) n->efd = -1;
  for (Inbound& in : n->inbound) {
    for (size_t w = 0; w < n->watches.size(); ++w)
      if (n->watches[w].word == in.tail) in.watch = (long)w;
  }
  n->th = std::thread(loop, n);
}

static int wait_for(Net* n, std::atomic<uint64_t>& done, uint64_t want, long timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  unsigned spins = 0;
  while (done.load(std::memory_order_acquire) < want) {
    if (std::chrono::steady_clock::now() > end || n->stalled_ms.load() != 0) return 1;
    if (++spins < 256) sched_yield();
    else {
      timespec ts{0, 50000};
      nanosleep(&ts, nullptr);
    }
  }
  return 0;
}

// Everything published so far put and complete at its target, then the mirrors and counts back
// to zero (call it once this rank's kernel has finished); 0, or 1 on timeout.
HN_API int hn_drain(void* h, long timeout_ms) {
  Net* n = static_cast<Net*>(h);
  const uint64_t want = n->drain_req.fetch_add(1) + 1;
  return wait_for(n, n->drain_done, want, timeout_ms);
}

// Mirrors and counters back to zero (between calls); 0, or 1 on timeout.
HN_API int hn_reset(void* h, long timeout_ms) {
  Net* n = static_cast<Net*>(h);
  const uint64_t want = n->reset_req.fetch_add(1) + 1;
  return wait_for(n, n->reset_done, want, timeout_ms);
}

// A gap between two polls of the thread longer than `ns` (the time after which the peers give up
// on a rank whose heartbeat stopped) stalls the proxy for good (Net::stall_ns); 0: never.
HN_API void hn_set_stall(void* h, uint64_t ns) {
  static_cast<Net*>(h)->stall_ns.store(ns, std::memory_order_relaxed);
}

// How long the gap that stalled the proxy was, in ms (0: not stalled).
HN_API uint64_t hn_stalled_ms(void* h) { return static_cast<Net*>(h)->stalled_ms.load(); }

// 0 while the peer's endpoint is fine, else the ucs_status_t that failed it.
HN_API int hn_peer_status(void* h, int peer) {
  Net* n = static_cast<Net*>(h);
  Peer* p = n->peers[peer];
  return p ? p->status.load() : 0;
}

HN_API const char* hn_status_string(int status) { return ucs_status_string((ucs_status_t)status); }

HN_API void hn_counters(void* h, uint64_t* out) {
  Net* n = static_cast<Net*>(h);
  out[0] = n->puts.load();
  out[1] = n->bytes_put.load();
  out[2] = n->ams.load();
  out[3] = n->am_bytes.load();
  out[4] = n->accepted.load();
  out[5] = n->rejected.load();
  out[6] = n->ctrls.load();
  out[7] = n->ctrl_bytes.load();
  out[8] = n->ctrl_rejected.load();
}

// Diagnostics, only before hn_start (the calling thread drives the worker): send one active
// message as the proxy does, on id `am` (1: a slot, 2: a control message) with any header
// (`hlen` bytes, to test what the receiver accepts) and `len` bytes of `data`, and progress until
// it has left; 0, or a ucs_status_t.
HN_API int hn_send_message(void* h, int peer, unsigned am, const void* header, uint64_t hlen,
                           const void* data, uint64_t len, long timeout_ms) {
  Net* n = static_cast<Net*>(h);
  if (n->th.joinable() || peer < 0 || peer >= (int)n->peers.size() || !peer_ok(n, peer))
    return (int)UCS_ERR_INVALID_PARAM;
  ucp_request_param_t prm;
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t r = ucp_am_send_nbx(n->peers[peer]->ep, am, header, hlen, data, len, &prm);
  if (UCS_PTR_IS_ERR(r)) return (int)UCS_PTR_STATUS(r);
  if (r == nullptr) return 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < end)
    ucp_worker_progress(n->worker);
  ucs_status_t st = ucp_request_check_status(r);
  ucp_request_free(r);
  return st == UCS_INPROGRESS ? (int)UCS_ERR_TIMED_OUT : (int)st;
}

// Diagnostics, only before hn_start: progress the worker for `ms` milliseconds (wire-up).
HN_API void hn_progress_for(void* h, long ms) {
  Net* n = static_cast<Net*>(h);
  if (n->th.joinable()) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) ucp_worker_progress(n->worker);
}

// Record the thread's steps (at most `cap` of them, from now on; 0: stop recording).
HN_API void hn_trace(void* h, uint64_t cap) {
  Net* n = static_cast<Net*>(h);
  std::lock_guard<std::mutex> g(n->trace_mu);
  n->trace.clear();
  n->trace.shrink_to_fit();
  n->trace_cap = cap;
  if (cap > 0) n->trace.reserve(cap);
  n->tracing.store(cap > 0);
}

// The recorded steps so far (at most `cap`, 4 words each: ns, kind, index, value), which are
// then dropped; returns how many.
HN_API uint64_t hn_trace_take(void* h, uint64_t* out, uint64_t cap) {
  Net* n = static_cast<Net*>(h);
  std::lock_guard<std::mutex> g(n->trace_mu);
  const uint64_t k = n->trace.size() < cap ? n->trace.size() : cap;
  for (uint64_t i = 0; i < k; ++i) {
    const TraceEv& e = n->trace[i];
    out[4 * i] = e.t_ns;
    out[4 * i + 1] = e.kind;
    out[4 * i + 2] = e.index;
    out[4 * i + 3] = e.value;
  }
  n->trace.erase(n->trace.begin(), n->trace.begin() + (long)k);
  return k;
}

// Stop the thread, close every endpoint (forcibly: a peer may be gone), release keys, memory
// registrations, the worker and the context.
HN_API void hn_destroy(void* h, long timeout_ms) {
  Net* n = static_cast<Net*>(h);
  if (n->th.joinable()) {
    n->stop.store(1, std::memory_order_release);
    n->th.join();
  }
  n->inbound.clear();           // messages that still arrive while closing are dropped
  if (n->stalled_ms.load() != 0) {
    // stalled: the peers closed their endpoints; progressing the worker would serve what waits
    // in the sockets (fatal inside UCX), so the endpoints and the worker are left as they are
    // (the operating system takes the sockets back when the process ends)
    for (Peer* p : n->peers) delete p;
    delete n;
    return;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (Pending& q : n->pending) ucp_request_cancel(n->worker, q.req);
  while (!n->pending.empty() && std::chrono::steady_clock::now() < end) {
    ucp_worker_progress(n->worker);
    reap(n);
  }
  if (n->flush_req != nullptr) {
    while (ucp_request_check_status(n->flush_req) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < end)
      ucp_worker_progress(n->worker);
    ucp_request_free(n->flush_req);
  }
  std::vector<void*> closing;
  for (Peer* p : n->peers) {
    if (!p) continue;
    for (ucp_rkey_h& k : p->rkey)
      if (k) ucp_rkey_destroy(k);
    if (p->ep) {
      // a flushing close: a forced one dropped the socket while a peer could still be acking
      // this rank's last puts, and UCX aborts that peer when its ack meets the failed endpoint
      // ("Endpoint timeout" in ucp_put_handler); bounded by ``timeout_ms`` as the rest
      ucp_request_param_t prm;
      prm.op_attr_mask = 0;
      ucs_status_ptr_t r = ucp_ep_close_nbx(p->ep, &prm);
      if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
    }
  }
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < end)
      ucp_worker_progress(n->worker);
    ucp_request_free(r);
  }
  for (ucp_mem_h m : n->mems) ucp_mem_unmap(n->ctx, m);
  ucp_worker_destroy(n->worker);
  ucp_cleanup(n->ctx);
  for (Pending& q : n->pending) free(q.owned);
  for (Peer* p : n->peers) delete p;
  delete n;
}

