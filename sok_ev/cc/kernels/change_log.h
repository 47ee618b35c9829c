// Which keys of an Embedding Variable changed since its last checkpoint: what
// an incremental checkpoint writes (sok_ev.Saver(incremental_save_restore=
// True)). Host memory, for CPU and GPU variables alike.
//
// Recording starts when a checkpoint of the variable is committed by a saver
// that saves incrementally (SokEv>MarkEmbeddingVariablesSaved) or restored by
// one; that checkpoint is the base of the next incremental one. Lookups
// record their keys (frequencies change, keys are inserted), updates theirs,
// evictions the keys they erase. A save takes the keys recorded so far
// before it reads the table (a change racing the save is written again next
// time, never lost); they are recorded again if that save is never
// committed.
#ifndef SOK_EV_CC_KERNELS_CHANGE_LOG_H_
#define SOK_EV_CC_KERNELS_CHANGE_LOG_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace sok_ev {

class ChangeLog {
 public:
  // Whether changes are recorded (cheap: read before every lookup).
  bool active() const { return active_.load(std::memory_order_acquire); }

  // Records from now on, relative to the checkpoint at `base`.
  void Activate(const std::string& base) {
    std::lock_guard<std::mutex> lock(mutex_);
    base_ = base;
    changed_.clear();
    pending_.clear();
    active_.store(true, std::memory_order_release);
  }

  // Stops recording (the table was replaced by something no checkpoint holds).
  void Deactivate() {
    std::lock_guard<std::mutex> lock(mutex_);
    base_.clear();
    changed_.clear();
    pending_.clear();
    active_.store(false, std::memory_order_release);
  }

  // keys: (n,) host
  template <typename Key>
  void Record(const Key* keys, int64_t n) {
    if (!active()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t i = 0; i < n; ++i) changed_.insert(static_cast<int64_t>(keys[i]));
  }

  // The keys changed since the base (those of a save that was never
  // committed included), handed to the save about to read the table.
  std::vector<int64_t> TakeForSave() {
    std::lock_guard<std::mutex> lock(mutex_);
    changed_.insert(pending_.begin(), pending_.end());
    pending_.assign(changed_.begin(), changed_.end());
    changed_.clear();
    return pending_;
  }

  // The save that took the keys is complete at `checkpoint`: it is the base
  // of the next incremental checkpoint.
  void CommitSave(const std::string& checkpoint) {
    std::lock_guard<std::mutex> lock(mutex_);
    base_ = checkpoint;
    pending_.clear();
    active_.store(true, std::memory_order_release);
  }

  std::string base() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return base_;
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> active_{false};
  std::string base_;
  std::unordered_set<int64_t> changed_;
  std::vector<int64_t> pending_;  // taken by a save not committed yet
};

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_CHANGE_LOG_H_
