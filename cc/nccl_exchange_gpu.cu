// NcclExchange (cc/nccl_exchange.h): NCCL loaded at first use, one
// communicator, stream and watcher thread per unique id.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>

#include "cc/nccl_exchange.h"
#include "cc/status_gpu.h"

namespace sok_ev {
namespace gpu {
namespace {

// The part of NCCL's C interface used here, declared as nccl.h (2.7 and
// later) declares it: the library is opened with dlopen, and TensorFlow's
// wheel ships no nccl.h to compile against.
struct NcclCommOpaque;
using ncclComm_t = NcclCommOpaque*;
struct ncclUniqueId {
  char internal[kNcclIdBytes];
};
using ncclResult_t = int;  // an enum in nccl.h: int-sized
constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
constexpr int kNcclUint8 = 1;  // ncclDataType_t

struct NcclLibrary {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  std::string load_error;  // empty once loaded
};

const NcclLibrary& Nccl() {
  static NcclLibrary* library = [] {
    auto* nccl = new NcclLibrary;  // kept for the process: comms outlive statics
    const char* configured = std::getenv("SOK_EV_NCCL_LIBRARY");
    const char* name = configured != nullptr && *configured != '\0' ? configured : "libnccl.so.2";
    void* handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      nccl->load_error = std::string("cannot load NCCL (") + name + "): " + (why ? why : "?") +
                         "; install NCCL 2.7 or later, or set SOK_EV_NCCL_LIBRARY to its path, "
                         "or SOK_EV_ROW_TRANSPORT=horovod to send the rows through Horovod";
      return nccl;
    }
    auto bind = [&](auto* pointer, const char* symbol) {
      *pointer =
          reinterpret_cast<std::remove_reference_t<decltype(*pointer)>>(dlsym(handle, symbol));
      if (*pointer == nullptr && nccl->load_error.empty()) {
        nccl->load_error = std::string(name) + " has no " + symbol + " (NCCL 2.7 or later needed)";
      }
    };
    bind(&nccl->get_unique_id, "ncclGetUniqueId");
    bind(&nccl->comm_init_rank, "ncclCommInitRank");
    bind(&nccl->send, "ncclSend");
    bind(&nccl->recv, "ncclRecv");
    bind(&nccl->group_start, "ncclGroupStart");
    bind(&nccl->group_end, "ncclGroupEnd");
    bind(&nccl->comm_abort, "ncclCommAbort");
    bind(&nccl->comm_get_async_error, "ncclCommGetAsyncError");
    bind(&nccl->get_error_string, "ncclGetErrorString");
    return nccl;
  }();
  return *library;
}

Status NcclStatus(ncclResult_t result, const std::string& what) {
  if (result == kNcclSuccess) return Status::Ok();
  return Status::Internal(what + " failed: " + Nccl().get_error_string(result));
}

Status CheckLoaded() {
  const NcclLibrary& nccl = Nccl();
  return nccl.load_error.empty() ? Status::Ok() : Status::Internal(nccl.load_error);
}

using Clock = std::chrono::steady_clock;

// "5", "0.5": a timeout as the user set it, for messages.
std::string SecondsText(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

struct NcclExchange::State {
  struct Pending {
    cudaEvent_t ended;
    Clock::time_point deadline;
    double timeout_seconds;
    Done done;
  };

  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0;
  int size = 0;
  std::mutex queue_mutex;  // pending, broken
  std::condition_variable wake;
  std::deque<Pending> pending;
  std::string broken;      // why the communicator was aborted; empty while usable
  std::mutex group_mutex;  // one exchange queued at a time; none while aborting

  // Runs for the process: reports the exchanges' ends in queue order (the
  // stream runs them in that order).
  void Watch() {
    cudaSetDevice(device);
    for (;;) {
      Pending front;
      {
        std::unique_lock<std::mutex> lock(queue_mutex);
        wake.wait(lock, [&] { return !pending.empty(); });
        front = pending.front();
      }
      const Status ended = AwaitEnd(front);
      std::deque<Pending> finished;
      {
        std::lock_guard<std::mutex> lock(queue_mutex);
        if (ended.ok()) {
          finished.push_back(pending.front());
          pending.pop_front();
        } else {
          finished.swap(pending);  // an aborted communicator ends them all
        }
      }
      for (Pending& p : finished) {
        cudaEventDestroy(p.ended);
        p.done(ended);
      }
    }
  }

  // Waits for one exchange: Ok once its event fired; the abort's error when
  // it did not by its deadline or NCCL reported a failure.
  Status AwaitEnd(const Pending& p) {
    const Clock::time_point spin_until = Clock::now() + std::chrono::milliseconds(2);
    for (;;) {
      const cudaError_t state = cudaEventQuery(p.ended);
      if (state == cudaSuccess) return Status::Ok();
      if (state != cudaErrorNotReady) {
        return Abort(std::string("the exchange failed on the GPU: ") + cudaGetErrorString(state));
      }
      ncclResult_t async_error = kNcclSuccess;
      Nccl().comm_get_async_error(comm, &async_error);
      if (async_error != kNcclSuccess && async_error != kNcclInProgress) {
        return Abort(std::string("NCCL reported: ") + Nccl().get_error_string(async_error));
      }
      const Clock::time_point now = Clock::now();
      if (now > p.deadline) {
        return Abort("worker " + std::to_string(rank) + " of " + std::to_string(size) +
                     ": an all-to-all did not end within " + SecondsText(p.timeout_seconds) +
                     " s (SOK_EV_EXCHANGE_TIMEOUT): another worker stopped before its part of "
                     "the exchange, or ran another one");
      }
      // Spin briefly (the step waits on this), then poll gently.
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // Marks the communicator broken, then aborts it: NCCL's kernels stop and
  // the stream's work ends. Under group_mutex, so no exchange is being
  // queued on the communicator as it goes, and none is queued after.
  Status Abort(const std::string& why) {
    std::lock_guard<std::mutex> group(group_mutex);
    std::string message;
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      broken = "the NCCL exchange was aborted: " + why;
      message = broken;
    }
    Nccl().comm_abort(comm);
    return Status::Internal(message);
  }
};

Status nccl_unique_id(std::string* id) {
  SOK_EV_RETURN_IF_ERROR(CheckLoaded());
  ncclUniqueId unique;
  SOK_EV_RETURN_IF_ERROR(NcclStatus(Nccl().get_unique_id(&unique), "ncclGetUniqueId"));
  id->assign(unique.internal, kNcclIdBytes);
  return Status::Ok();
}

Status NcclExchange::get(const std::string& id, int rank, int size, double timeout_seconds,
                         std::shared_ptr<NcclExchange>* exchange) {
  if (id.size() != static_cast<size_t>(kNcclIdBytes)) {
    return Status::InvalidArgument("an NCCL communicator id has " + std::to_string(kNcclIdBytes) +
                                   " bytes, got " + std::to_string(id.size()));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument("NCCL rank " + std::to_string(rank) + " of " +
                                   std::to_string(size) + " workers is out of range");
  }
  SOK_EV_RETURN_IF_ERROR(CheckLoaded());
  // One entry per id, each made under its own lock: two lookups' first
  // exchanges may make their communicators in either order on each worker.
  struct Entry {
    std::mutex mutex;
    std::shared_ptr<State> state;
  };
  static std::mutex registry_mutex;
  static auto* registry = new std::map<std::string, std::shared_ptr<Entry>>;
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    std::shared_ptr<Entry>& slot = (*registry)[id];
    if (slot == nullptr) slot = std::make_shared<Entry>();
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->mutex);
  if (entry->state == nullptr) {
    std::shared_ptr<State> made;
    SOK_EV_RETURN_IF_ERROR(MakeState(id, rank, size, timeout_seconds, &made));
    entry->state = made;
  } else if (entry->state->rank != rank || entry->state->size != size) {
    return Status::InvalidArgument("the NCCL communicator is worker " +
                                   std::to_string(entry->state->rank) + " of " +
                                   std::to_string(entry->state->size) + ", asked as worker " +
                                   std::to_string(rank) + " of " + std::to_string(size));
  }
  exchange->reset(new NcclExchange(rank, size, entry->state));
  return Status::Ok();
}

Status NcclExchange::MakeState(const std::string& id, int rank, int size, double timeout_seconds,
                               std::shared_ptr<State>* state) {
  auto made = std::make_shared<State>();
  made->rank = rank;
  made->size = size;
  SOK_EV_CUDA_RETURN(cudaGetDevice(&made->device));
  SOK_EV_CUDA_RETURN(cudaStreamCreateWithFlags(&made->stream, cudaStreamNonBlocking));
  // ncclCommInitRank waits for every worker; a worker that never comes
  // would hold this thread forever, so it runs on its own thread.
  struct Init {
    std::mutex mutex;
    std::condition_variable ended;
    bool finished = false;
    ncclResult_t result = kNcclSuccess;
    ncclComm_t comm = nullptr;
  };
  auto init = std::make_shared<Init>();
  ncclUniqueId unique;
  std::memcpy(unique.internal, id.data(), kNcclIdBytes);
  const int device = made->device;
  std::thread([init, unique, device, rank, size] {
    cudaSetDevice(device);
    ncclComm_t comm = nullptr;
    const ncclResult_t result = Nccl().comm_init_rank(&comm, size, unique, rank);
    std::lock_guard<std::mutex> lock(init->mutex);
    init->result = result;
    init->comm = comm;
    init->finished = true;
    init->ended.notify_all();
  }).detach();
  std::unique_lock<std::mutex> wait(init->mutex);
  if (!init->ended.wait_until(wait, DeadlineAfter(timeout_seconds),
                              [&] { return init->finished; })) {
    return Status::Internal("worker " + std::to_string(rank) + " of " + std::to_string(size) +
                            ": the other workers did not join the NCCL communicator within " +
                            SecondsText(timeout_seconds) + " s (SOK_EV_EXCHANGE_TIMEOUT)");
  }
  SOK_EV_RETURN_IF_ERROR(NcclStatus(
      init->result,
      "ncclCommInitRank (worker " + std::to_string(rank) + " of " + std::to_string(size) + ")"));
  made->comm = init->comm;
  std::thread([made] { made->Watch(); }).detach();
  *state = made;
  return Status::Ok();
}

Status NcclExchange::alltoall(const void* send, const int64_t* send_bytes, void* recv,
                              const int64_t* recv_bytes, void* stream, double timeout_seconds,
                              Done done) {
  State& state = *state_;
  std::lock_guard<std::mutex> group(state.group_mutex);
  {
    std::lock_guard<std::mutex> lock(state.queue_mutex);
    if (!state.broken.empty()) return Status::Internal(state.broken);
  }
  const cudaStream_t caller = static_cast<cudaStream_t>(stream);
  cudaEvent_t queued, ended;
  SOK_EV_CUDA_RETURN(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  SOK_EV_CUDA_RETURN(cudaEventCreateWithFlags(&ended, cudaEventDisableTiming));
  // The exchange starts after the caller's work queued so far (which wrote
  // `send` and handed out `recv`). A destroyed event stays valid for the
  // wait already queued on it.
  cudaError_t error = cudaEventRecord(queued, caller);
  if (error == cudaSuccess) error = cudaStreamWaitEvent(state.stream, queued, 0);
  cudaEventDestroy(queued);
  if (error != cudaSuccess) {
    cudaEventDestroy(ended);
    return cuda_status(error, "ordering the NCCL exchange after the caller's stream");
  }
  const NcclLibrary& nccl = Nccl();
  Status status = NcclStatus(nccl.group_start(), "ncclGroupStart");
  const char* send_at = static_cast<const char*>(send);
  char* recv_at = static_cast<char*>(recv);
  for (int w = 0; w < size_ && status.ok(); ++w) {
    if (send_bytes[w] > 0) {
      status = NcclStatus(
          nccl.send(send_at, send_bytes[w], kNcclUint8, w, state.comm, state.stream), "ncclSend");
    }
    if (status.ok() && recv_bytes[w] > 0) {
      status = NcclStatus(
          nccl.recv(recv_at, recv_bytes[w], kNcclUint8, w, state.comm, state.stream), "ncclRecv");
    }
    send_at += send_bytes[w];
    recv_at += recv_bytes[w];
  }
  const Status grouped = NcclStatus(nccl.group_end(), "ncclGroupEnd");
  if (status.ok()) status = grouped;
  if (status.ok()) {
    status = cuda_status(cudaEventRecord(ended, state.stream), "recording the exchange's end");
  }
  if (!status.ok()) {
    cudaEventDestroy(ended);
    return status;
  }
  {
    std::lock_guard<std::mutex> lock(state.queue_mutex);
    state.pending.push_back(
        State::Pending{ended, DeadlineAfter(timeout_seconds), timeout_seconds, std::move(done)});
  }
  state.wake.notify_one();
  return Status::Ok();
}

}  // namespace gpu
}  // namespace sok_ev
