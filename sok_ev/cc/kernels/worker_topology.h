// Which worker this process is, as sok_ev.init() found it (one worker until
// then). Checkpoint kernels read it when they run, not when their graph was
// built, so one graph -- identical on every worker, exported and imported
// elsewhere -- saves this worker's shard and restores the keys this worker
// owns, whatever the worker count.
#ifndef SOK_EV_CC_KERNELS_WORKER_TOPOLOGY_H_
#define SOK_EV_CC_KERNELS_WORKER_TOPOLOGY_H_

#include <cstdint>

namespace sok_ev {

struct WorkerTopology {
  int32_t worker = 0;
  int32_t num_workers = 1;
};

WorkerTopology CurrentWorkerTopology();
void SetWorkerTopology(WorkerTopology topology);

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_WORKER_TOPOLOGY_H_
