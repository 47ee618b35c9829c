// The rows' all-to-all over NCCL directly, without Horovod (issue 12's
// "fewer collectives per step"): a GPU transport for the row messages of the
// many-worker lookup, whose sizes both ends already know, so nothing is
// negotiated before the bytes move.
//
// Each communicator has its own CUDA stream. An exchange waits for the work
// queued on the caller's stream before it (which wrote what it sends); the
// caller's stream never waits for an exchange: its end is reported on the
// host, by a watcher thread, and only then does anything read what arrived.
// So the caller's later, independent work (another lookup's, the dense
// model's) runs on the GPU while the bytes move, and two lookups' exchanges,
// queued in different orders on different workers, cannot wait for each
// other. The watcher aborts the communicator when an exchange has not ended
// within its timeout (a worker that stopped before its part), so every
// worker gets an error instead of waiting forever.
//
// NCCL is loaded when first used (libnccl.so.2, or SOK_EV_NCCL_LIBRARY), so
// the op library loads on machines without it. Implemented in
// nccl_exchange_gpu.cu (GPU builds only).
#ifndef SOK_EV_CC_NCCL_EXCHANGE_H_
#define SOK_EV_CC_NCCL_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cc/common.h"

namespace sok_ev {
namespace gpu {

// Bytes of an NCCL unique id, the seed every worker of a communicator
// shares.
constexpr int kNcclIdBytes = 128;

// A fresh NCCL unique id (kNcclIdBytes bytes). Fails when NCCL cannot be
// loaded.
Status nccl_unique_id(std::string* id);

class NcclExchange {
 public:
  using Done = std::function<void(Status)>;

  // The process's communicator made from `id` as worker `rank` of `size` on
  // the current CUDA device, made at the first call for `id`
  // (ncclCommInitRank: collective, every worker of the id makes it). Fails
  // if the other workers do not make theirs within `timeout_seconds`.
  static Status get(const std::string& id, int rank, int size, double timeout_seconds,
                    std::shared_ptr<NcclExchange>* exchange);

  // Queues after the work queued on `stream` so far: send_bytes[w] bytes of
  // `send` (worker 0's first, then worker 1's, ...) to worker w, and
  // recv_bytes[w] bytes from worker w into `recv` (in the same order).
  // `stream` does not wait for it: `recv` may be read once `done` runs, on
  // the watcher thread, with Ok once the exchange ended, or an error when it
  // did not within the timeout (the communicator is then aborted and every
  // later exchange on it fails at once). Both buffers must stay valid until
  // then. Every worker must queue its exchanges on one communicator in the
  // same order, with matching sizes.
  // Returns an error, without calling `done`, if nothing could be queued.
  Status alltoall(const void* send, const int64_t* send_bytes, void* recv,
                  const int64_t* recv_bytes, void* stream, double timeout_seconds, Done done);

  int rank() const { return rank_; }
  int size() const { return size_; }

  struct State;  // communicator, stream and watcher (nccl_exchange_gpu.cu)

 private:
  static Status MakeState(const std::string& id, int rank, int size, double timeout_seconds,
                          std::shared_ptr<State>* state);
  NcclExchange(int rank, int size, std::shared_ptr<State> state)
      : rank_(rank), size_(size), state_(std::move(state)) {}

  int rank_;
  int size_;
  std::shared_ptr<State> state_;
};

}  // namespace gpu
}  // namespace sok_ev

#endif  // SOK_EV_CC_NCCL_EXCHANGE_H_
