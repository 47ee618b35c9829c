// The TensorFlow resource behind an Embedding Variable: a thin owner of one
// core hash table (cc/hash_table_cpu.h) of the variable's key dtype.
#ifndef SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_
#define SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/hash_table_cpu.h"
#include "cc/initializer.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/types.h"

namespace sok_ev {

class EmbeddingVariable : public tensorflow::ResourceBase {
 public:
  EmbeddingVariable(std::string name, tensorflow::DataType key_dtype,
                    int64_t embedding_dim)
      : name_(std::move(name)), key_dtype_(key_dtype), embedding_dim_(embedding_dim) {}

  const std::string& name() const { return name_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  int64_t embedding_dim() const { return embedding_dim_; }

  // Replaces the table with an empty one (TF semantics of re-running a
  // variable's initializer). Running ops keep the table they started with.
  // For kDefaultValueMatrix, `default_values` backs initializer.default_values.
  void initialize(const InitializerSpec& initializer,
                  std::vector<float> default_values) {
    std::lock_guard<std::mutex> lock(mutex_);
    initializer_ = initializer;
    default_values_ = std::move(default_values);
    initializer_.default_values = default_values_.data();
    if (key_dtype_ == tensorflow::DT_INT32) {
      table32_ = std::make_shared<cpu::HashTable<int32_t>>(embedding_dim_, initializer_);
    } else {
      table64_ = std::make_shared<cpu::HashTable<int64_t>>(embedding_dim_, initializer_);
    }
  }

  // An empty table with this variable's initializer, to be filled and then
  // swapped in with replace_table (checkpoint restore).
  template <typename Key>
  std::shared_ptr<cpu::HashTable<Key>> new_empty_table() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::make_shared<cpu::HashTable<Key>>(embedding_dim_, initializer_);
  }

  template <typename Key>
  void replace_table(std::shared_ptr<cpu::HashTable<Key>> table);

  bool is_initialized() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return table32_ != nullptr || table64_ != nullptr;
  }

  // The table for keys of type Key; null before initialization.
  template <typename Key>
  std::shared_ptr<cpu::HashTable<Key>> table() const;

  std::string DebugString() const override {
    return "sok_ev EmbeddingVariable '" + name_ + "' (key " +
           tensorflow::DataTypeString(key_dtype_) + ", dim " +
           std::to_string(embedding_dim_) + ")";
  }

 private:
  const std::string name_;
  const tensorflow::DataType key_dtype_;
  const int64_t embedding_dim_;
  mutable std::mutex mutex_;  // guards the members below, not the tables
  InitializerSpec initializer_;
  std::vector<float> default_values_;
  std::shared_ptr<cpu::HashTable<int32_t>> table32_;
  std::shared_ptr<cpu::HashTable<int64_t>> table64_;
};

template <>
inline std::shared_ptr<cpu::HashTable<int32_t>> EmbeddingVariable::table() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table32_;
}

template <>
inline std::shared_ptr<cpu::HashTable<int64_t>> EmbeddingVariable::table() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table64_;
}

template <>
inline void EmbeddingVariable::replace_table(
    std::shared_ptr<cpu::HashTable<int32_t>> table) {
  std::lock_guard<std::mutex> lock(mutex_);
  table32_ = std::move(table);
}

template <>
inline void EmbeddingVariable::replace_table(
    std::shared_ptr<cpu::HashTable<int64_t>> table) {
  std::lock_guard<std::mutex> lock(mutex_);
  table64_ = std::move(table);
}

}  // namespace sok_ev

#endif  // SOK_EV_CC_KERNELS_EMBEDDING_VARIABLE_H_
