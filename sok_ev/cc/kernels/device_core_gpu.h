// Core<GPUDevice>: the GPU twin of device_core_cpu.h. Core work is ordered on
// TF's compute stream for the op's GPU; scratch and table memory come from
// TF's allocator for that GPU, whose frees are safe for work queued on that
// one stream (TF's own GPU kernels rely on the same). A data-dependent size
// (unique count, table size) is read back with one stream sync.
// Included by device_core.h only, in GOOGLE_CUDA builds.
#ifndef SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_
#define SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_

#if GOOGLE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cc/combine.h"
#include "cc/common.h"
#include "cc/hash_table_gpu.h"
#include "cc/initializer.h"
#include "cc/optimizers.h"
#include "cc/partition.h"
#include "cc/status_gpu.h"
#include "cc/unique.h"
#include "sok_ev/cc/kernels/export_buffers.h"
#include "sok_ev/cc/kernels/scratch_vector.h"
#include "sok_ev/cc/kernels/tf_status.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace sok_ev {

// The core's DeviceAllocator over TF's allocator of one GPU. TF's allocator
// lives as long as the process, so a table may keep this for its lifetime.
class TfGpuAllocator : public DeviceAllocator {
 public:
  explicit TfGpuAllocator(tensorflow::Allocator* allocator) : allocator_(allocator) {}
  // Null when out of memory; the core turns that into an error.
  void* allocate(size_t bytes) override {
    return allocator_->AllocateRaw(tensorflow::Allocator::kAllocatorAlignment, bytes);
  }
  void deallocate(void* pointer) override { allocator_->DeallocateRaw(pointer); }

 private:
  tensorflow::Allocator* allocator_;
};

template <>
class Core<GPUDevice> {
 public:
  template <typename Key>
  using Table = gpu::HashTable<Key>;
  // The GPU table's host-side bounds and growth are not thread-safe.
  static constexpr bool kTableIsThreadSafe = false;

  explicit Core(tensorflow::OpKernelContext* context)
      : op_(context), allocator_(DeviceAllocatorOf(context)) {
    context_.stream = context->eigen_device<GPUDevice>().stream();
    context_.allocator = &allocator_;
  }

  static std::unique_ptr<DeviceAllocator> NewTableAllocator(tensorflow::OpKernelContext* context) {
    return std::make_unique<TfGpuAllocator>(DeviceAllocatorOf(context));
  }

  // table_allocator: kept by the table for its lifetime, so it must outlive it.
  // initializer.default_values: (default_value_dim, dim) device, copied.
  template <typename Key>
  absl::Status NewTable(DeviceAllocator* table_allocator, int64_t dim,
                        const InitializerSpec& initializer, std::shared_ptr<Table<Key>>* table) {
    GpuContext create = context_;
    create.allocator = table_allocator;
    Table<Key>* created = nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(
        Table<Key>::Create(create, dim, initializer, gpu::HashTableOptions(), &created)));
    table->reset(created);
    return absl::OkStatus();
  }

  // size: host; syncs the stream.
  template <typename Key>
  absl::Status Size(Table<Key>& table, int64_t* size) {
    return ToTfStatus(table.size(context_, size));
  }

  template <typename Key>
  absl::Status AddSlot(Table<Key>& table, const std::string& name, float initial_value,
                       int* index) {
    return ToTfStatus(table.add_slot(context_, name, initial_value, index));
  }

  //   keys: (n,)  values: (n, dim) out  frequencies: (n,)
  template <typename Key>
  absl::Status FindOrInsert(Table<Key>& table, const Key* keys, int64_t n, float* values,
                            const int64_t* frequencies) {
    return ToTfStatus(
        table.find_or_insert(context_, keys, n, values, frequencies, /*row_ids=*/nullptr));
  }

  //   keys: (n,)  values: (n, dim) out
  template <typename Key>
  absl::Status Find(const Table<Key>& table, const Key* keys, int64_t n, float* values) {
    return ToTfStatus(
        table.find(context_, keys, n, values, /*found=*/nullptr, /*initial_for_missing=*/true));
  }

  //   keys: (n,) distinct  rows: (n, row_width)  frequencies, versions: (n,)
  template <typename Key>
  absl::Status InsertOrAssign(Table<Key>& table, const Key* keys, int64_t n, const float* rows,
                              const int64_t* frequencies, const int64_t* versions) {
    return ToTfStatus(table.insert_or_assign(context_, keys, n, rows, frequencies, versions));
  }

  // InsertOrAssign with host buffers: copied to device temporaries first.
  // Syncs the stream.
  //   keys: (n,) host  rows: (n, row_width) host  frequencies, versions:
  //   (n,) host or null
  template <typename Key>
  absl::Status InsertOrAssignFromHost(Table<Key>& table, const Key* keys, int64_t n,
                                      const float* rows, const int64_t* frequencies,
                                      const int64_t* versions) {
    if (n == 0) return absl::OkStatus();
    const int64_t width = table.row_width();
    tensorflow::Tensor device_keys, device_rows, device_frequencies, device_versions;
    TF_RETURN_IF_ERROR(Temp<Key>(n, &device_keys));
    TF_RETURN_IF_ERROR(Temp<float>(n * width, &device_rows));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &device_frequencies));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &device_versions));
    TF_RETURN_IF_ERROR(CopyFromHost(keys, n, VectorData<Key>(device_keys)));
    TF_RETURN_IF_ERROR(CopyFromHost(rows, n * width, VectorData<float>(device_rows)));
    int64_t* frequencies_on_device = nullptr;
    int64_t* versions_on_device = nullptr;
    if (frequencies != nullptr) {
      frequencies_on_device = VectorData<int64_t>(device_frequencies);
      TF_RETURN_IF_ERROR(CopyFromHost(frequencies, n, frequencies_on_device));
    }
    if (versions != nullptr) {
      versions_on_device = VectorData<int64_t>(device_versions);
      TF_RETURN_IF_ERROR(CopyFromHost(versions, n, versions_on_device));
    }
    TF_RETURN_IF_ERROR(InsertOrAssign(table, VectorData<Key>(device_keys), n,
                                      VectorData<float>(device_rows), frequencies_on_device,
                                      versions_on_device));
    return Cuda(cudaStreamSynchronize(stream()), "stream sync after a restore batch");
  }

  // evicted: host; syncs the stream.
  template <typename Key>
  absl::Status EvictStale(Table<Key>& table, int64_t global_step, int64_t steps_to_live,
                          int64_t* evicted) {
    return ToTfStatus(table.evict_stale(context_, global_step, steps_to_live, evicted));
  }

  // The table's size is read back first to size the outputs; the caller
  // holds the variable's table lock, so the export finds exactly that many.
  template <typename Key>
  absl::Status ExportAll(Table<Key>& table, const ExportAllocator<Key>& allocate) {
    int64_t n = 0;
    TF_RETURN_IF_ERROR(Size(table, &n));
    ExportBuffers<Key> out;
    TF_RETURN_IF_ERROR(allocate(n, table.row_width(), &out));
    int64_t written = 0;
    TF_RETURN_IF_ERROR(ToTfStatus(table.export_all(context_, out.keys, out.rows, out.frequencies,
                                                   out.versions, n, &written)));
    if (written != n) {
      return tensorflow::errors::Internal("export wrote ", written, " keys, size was ", n);
    }
    return absl::OkStatus();
  }

  // The whole table in host batches (checkpoints). The GPU table exports in
  // one piece, so the table is first copied whole into device temporaries
  // (a second copy on the GPU), then to host one batch at a time.
  template <typename Key>
  absl::Status ExportBatches(Table<Key>& table, int64_t max_batch, const ExportBegin& begin,
                             const ExportEmit<Key>& emit) {
    int64_t n = 0;
    TF_RETURN_IF_ERROR(Size(table, &n));
    const int64_t width = table.row_width();
    TF_RETURN_IF_ERROR(begin(n, width));
    if (n == 0) return absl::OkStatus();
    tensorflow::Tensor keys, rows, frequencies, versions;
    TF_RETURN_IF_ERROR(Temp<Key>(n, &keys));
    TF_RETURN_IF_ERROR(Temp<float>(n * width, &rows));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &frequencies));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &versions));
    int64_t written = 0;
    TF_RETURN_IF_ERROR(ToTfStatus(table.export_all(
        context_, VectorData<Key>(keys), VectorData<float>(rows), VectorData<int64_t>(frequencies),
        VectorData<int64_t>(versions), n, &written)));
    if (written != n) {
      return tensorflow::errors::Internal("export wrote ", written, " keys, size was ", n);
    }
    const int64_t batch = std::max<int64_t>(1, std::min(max_batch, n));
    std::vector<Key> host_keys(batch);
    std::vector<float> host_rows(batch * width);
    std::vector<int64_t> host_frequencies(batch), host_versions(batch);
    for (int64_t start = 0; start < n; start += batch) {
      const int64_t count = std::min(batch, n - start);
      TF_RETURN_IF_ERROR(CopyToHost(VectorData<Key>(keys) + start, count, host_keys.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<float>(rows) + start * width, count * width, host_rows.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<int64_t>(frequencies) + start, count, host_frequencies.data()));
      TF_RETURN_IF_ERROR(
          CopyToHost(VectorData<int64_t>(versions) + start, count, host_versions.data()));
      TF_RETURN_IF_ERROR(
          emit(HostExportBatch<Key>{host_keys.data(), host_rows.data(), host_frequencies.data(),
                                    host_versions.data(), count}));
    }
    return absl::OkStatus();
  }

  // As Core<CPUDevice>::ApplyOptimizer. Duplicates are summed by
  // combine_backward with one entry per sample (row_offsets 0, 1, ..., n)
  // and weight 1, which adds each key's gradients in entry order, as the CPU
  // twin does, so both give the same bits.
  //   keys: (n,)  grads: (n, dim)
  template <typename Key>
  absl::Status ApplyOptimizer(Table<Key>& table, const OptimizerSpec& spec, const Key* keys,
                              int64_t n, const float* grads, int64_t dim, int64_t global_step) {
    tensorflow::Tensor unique, inverse, num_unique_device, offsets;
    TF_RETURN_IF_ERROR(Temp<Key>(n, &unique));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &inverse));
    TF_RETURN_IF_ERROR(Temp<int64_t>(1, &num_unique_device));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n + 1, &offsets));
    Key* unique_keys = VectorData<Key>(unique);            // (n,)
    int64_t* unique_index = VectorData<int64_t>(inverse);  // (n,)
    int64_t* row_offsets = VectorData<int64_t>(offsets);   // (n + 1,)
    TF_RETURN_IF_ERROR(UniqueKeys(keys, n, unique_keys, unique_index, /*counts=*/nullptr,
                                  VectorData<int64_t>(num_unique_device)));
    // A host iota: cudaMemcpyAsync from pageable memory has consumed it on return.
    std::vector<int64_t> iota(n + 1);
    std::iota(iota.begin(), iota.end(), int64_t{0});
    TF_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(row_offsets, iota.data(), (n + 1) * sizeof(int64_t),
                                            cudaMemcpyHostToDevice, stream()),
                            "copy row offsets to the GPU"));
    int64_t num_unique = 0;
    TF_RETURN_IF_ERROR(CopyToHost(VectorData<int64_t>(num_unique_device), 1, &num_unique));
    tensorflow::Tensor summed, rows;
    TF_RETURN_IF_ERROR(Temp<float>(num_unique * dim, &summed));
    // Row pointers, kept in an int64 vector of the same width.
    static_assert(sizeof(float*) == sizeof(int64_t), "row pointers are 64-bit");
    TF_RETURN_IF_ERROR(Temp<int64_t>(num_unique, &rows));
    float* summed_grads = VectorData<float>(summed);  // (num_unique, dim)
    float** row_pointers = VectorData<float*>(rows);  // (num_unique,)
    TF_RETURN_IF_ERROR(CombineBackward(grads, unique_index, /*weights=*/nullptr, row_offsets, n,
                                       dim, Combiner::kSum, num_unique, summed_grads));
    TF_RETURN_IF_ERROR(ToTfStatus(
        table.update_rows(context_, unique_keys, num_unique, global_step, row_pointers)));
    gpu::apply_optimizer(context_, spec, row_pointers, summed_grads, num_unique, dim);
    return Pending();
  }

  // Unique keys in ascending order (the GPU twin's order).
  //   keys: (n,)  unique, inverse: (n,) out  counts: (n,) out or null
  //   num_unique: (1,) out
  template <typename Key>
  absl::Status UniqueKeys(const Key* keys, int64_t n, Key* unique, int64_t* inverse,
                          int64_t* counts, int64_t* num_unique) {
    gpu::unique_keys(context_, keys, n, unique, inverse, counts, num_unique);
    return Pending();
  }

  // Counts the distinct keys on the GPU and reads back that one number, so
  // the batch stays on the device; the error therefore names no key.
  //   keys: (n,)
  template <typename Key>
  absl::Status CheckDistinct(const Key* keys, int64_t n, const std::string& where) {
    tensorflow::Tensor unique, inverse, num_unique_device;
    TF_RETURN_IF_ERROR(Temp<Key>(n, &unique));
    TF_RETURN_IF_ERROR(Temp<int64_t>(n, &inverse));
    TF_RETURN_IF_ERROR(Temp<int64_t>(1, &num_unique_device));
    TF_RETURN_IF_ERROR(UniqueKeys(keys, n, VectorData<Key>(unique), VectorData<int64_t>(inverse),
                                  /*counts=*/nullptr, VectorData<int64_t>(num_unique_device)));
    int64_t num_unique = 0;
    TF_RETURN_IF_ERROR(CopyToHost(VectorData<int64_t>(num_unique_device), 1, &num_unique));
    if (num_unique != n) {
      return tensorflow::errors::InvalidArgument(where, ": a key appears more than once (", n,
                                                 " keys, ", num_unique, " distinct)");
    }
    return absl::OkStatus();
  }

  //   keys, keys_by_owner, positions: (n,)  counts: (num_workers,) out
  template <typename Key>
  absl::Status PartitionByOwner(const Key* keys, int64_t n, int32_t num_workers, Key* keys_by_owner,
                                int64_t* positions, int64_t* counts) {
    gpu::partition_by_owner(context_, keys, n, num_workers, keys_by_owner, positions, counts);
    return Pending();
  }

  // Not checked on the GPU: the core has no device-side check, and copying
  // the entries to host would cost a transfer and a sync per table. Sample
  // ids outside [0, batch) or out of order give wrong row offsets; a unique
  // index outside [0, num_unique) reads or sums outside the unique rows
  // (undefined results, possibly a device fault).
  absl::Status CheckCombineEntries(int /*t*/, const int64_t* /*sample_ids*/,
                                   const int64_t* /*unique_index*/, int64_t /*nnz*/,
                                   int64_t /*batch*/, int64_t /*num_unique*/) {
    return absl::OkStatus();
  }

  //   sample_ids: (nnz,)  row_offsets: (batch + 1,) out
  absl::Status RowOffsets(const int64_t* sample_ids, int64_t nnz, int64_t batch,
                          int64_t* row_offsets) {
    gpu::row_offsets_from_sample_ids(context_, sample_ids, nnz, batch, row_offsets);
    return Pending();
  }

  //   unique_values: (num_unique, dim)  unique_index: (nnz,)  weights: (nnz,)
  //   or null  row_offsets: (batch + 1,)  out: (batch, dim)
  absl::Status CombineForward(const float* unique_values, const int64_t* unique_index,
                              const float* weights, const int64_t* row_offsets, int64_t batch,
                              int64_t dim, Combiner combiner, float* out) {
    gpu::combine_forward(context_, unique_values, unique_index, weights, row_offsets, batch, dim,
                         combiner, out);
    return Pending();
  }

  //   grad_out: (batch, dim)  grad_unique: (num_unique, dim) out; the rest as
  //   CombineForward. Syncs the stream (the core reads nnz back).
  absl::Status CombineBackward(const float* grad_out, const int64_t* unique_index,
                               const float* weights, const int64_t* row_offsets, int64_t batch,
                               int64_t dim, Combiner combiner, int64_t num_unique,
                               float* grad_unique) {
    gpu::combine_backward(context_, grad_out, unique_index, weights, row_offsets, batch, dim,
                          combiner, num_unique, grad_unique);
    return Pending();
  }

  //   dst, src: (count,) device
  template <typename T>
  absl::Status Copy(T* dst, const T* src, int64_t count) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, stream()),
                "device-to-device copy");
  }

  //   dst: (count,) device
  template <typename T>
  absl::Status SetZero(T* dst, int64_t count) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemsetAsync(dst, 0, count * sizeof(T), stream()), "zero fill");
  }

  // Syncs the stream, which also surfaces faults of work queued before.
  //   src: (count,) device  dst: (count,) host
  template <typename T>
  absl::Status CopyToHost(const T* src, int64_t count, T* dst) {
    if (count > 0) {
      TF_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost, stream()),
               "device-to-host copy"));
    }
    return Cuda(cudaStreamSynchronize(stream()), "stream sync after a device-to-host copy");
  }

 private:
  static tensorflow::Allocator* DeviceAllocatorOf(tensorflow::OpKernelContext* context) {
    return context->device()->GetAllocator(tensorflow::AllocatorAttributes());
  }

  cudaStream_t stream() const { return gpu::stream_of(context_); }

  static absl::Status Cuda(cudaError_t error, const char* what) {
    return ToTfStatus(gpu::cuda_status(error, what));
  }

  //   src: (count,) host  dst: (count,) device
  template <typename T>
  absl::Status CopyFromHost(const T* src, int64_t count, T* dst) {
    if (count == 0) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream()),
                "host-to-device copy");
  }

  // The gpu:: free functions record errors per host thread instead of
  // returning them.
  static absl::Status Pending() { return ToTfStatus(gpu::take_last_error()); }

  template <typename T>
  absl::Status Temp(int64_t count, tensorflow::Tensor* tensor) {
    return AllocateVector<T>(op_, count, tensor);
  }

  tensorflow::OpKernelContext* op_;
  TfGpuAllocator allocator_;  // the core's scratch memory
  GpuContext context_;
};

}  // namespace sok_ev

#endif  // GOOGLE_CUDA
#endif  // SOK_EV_CC_KERNELS_DEVICE_CORE_GPU_H_
