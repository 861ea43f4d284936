// The rows a follower serves (issue 17): the values of every table at one committed version,
// read by any number of threads while one thread moves them to the next version.
//
// A version is a View: for each table its base (a concurrent index of keys to rows and the
// rows' values) and the overlays of the versions applied since the base last absorbed them
// (newest first; each an immutable map of a version's upserts and tombstones). A lookup takes
// the current view (a copy of a shared pointer: the only moment it shares anything with the
// writer), reads each key from the newest overlay that has it, else from the base, and
// so sees exactly one version for the whole batch.
//
// apply() moves to the next version in three steps, none of which waits for a reader beyond
// the pointer swap:
//   1. the version's changes become an overlay, published in a new view (memory: the changed
//      rows, once);
//   2. once no reader holds an older view (readers hold one only for a lookup), the overlay is
//      merged into the base in place: readers of the new view never read the base for a key the
//      overlay holds, and no reader of an older view is left to see the change;
//   3. a view without the overlay is published, and the overlay goes with the last reader of the
//      view that had it.
// The base's index grows by a new index (keys and row ids only, never the values) published in
// the view of step 3; the old one goes with its last reader.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace embstore::serving {

// A shared pointer that one thread replaces while others copy it: the copy and the swap each
// hold a mutex for the length of a pointer copy. (libstdc++ 12's std::atomic<std::shared_ptr>
// reads the pointer outside what ThreadSanitizer sees as synchronized.) The value a swap
// replaces is released by the caller, outside the lock.
template <typename T>
class SharedSlot {
 public:
  std::shared_ptr<T> load() const {
    std::lock_guard lock(mutex_);
    return value_;
  }
  std::shared_ptr<T> exchange(std::shared_ptr<T> v) {
    std::lock_guard lock(mutex_);
    value_.swap(v);
    return v;
  }
  void store(std::shared_ptr<T> v) { exchange(std::move(v)); }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<T> value_;
};

// One version's changes to one table: rows (keys and values, rows x dim) and tombstones.
struct TableChanges {
  std::vector<int64_t> keys;
  std::vector<float> values;
  std::vector<int64_t> tombstones;
};

// Keys to rows, for one writer and any number of readers at once. A reader never sees a torn
// slot: each slot's state is published after its key and row (release/acquire), and the writer
// changes only slots of keys that the readers' view holds in an overlay, so a reader probing
// for another key only passes over them.
class ConcurrentIndex {
 public:
  static constexpr uint32_t kNoRow = UINT32_MAX;
  explicit ConcurrentIndex(uint64_t capacity);  // slots: a power of two >= 2 x capacity
  // The row of key, or kNoRow.
  uint32_t find(int64_t key) const;
  // Writer only. false when full (the writer then builds a larger index).
  bool insert(int64_t key, uint32_t row);
  // The row key had (kNoRow if none), now gone.
  uint32_t erase(int64_t key);
  uint64_t size() const { return size_; }
  uint64_t capacity() const { return capacity_; }
  // Every key and row (writer only), for a larger index.
  void for_each(const std::function<void(int64_t, uint32_t)>& f) const;

 private:
  enum : uint32_t { kEmpty = 0, kFull = 1, kErased = 2 };
  struct Slot {
    std::atomic<uint32_t> state{kEmpty};
    std::atomic<uint32_t> row{0};
    std::atomic<int64_t> key{0};
  };
  uint64_t mask_ = 0;
  uint64_t capacity_ = 0;         // keys it takes before it must grow (half its slots)
  uint64_t size_ = 0, used_ = 0;  // keys, and slots not empty (erased ones included)
  std::unique_ptr<Slot[]> slots_;
};

// The values of rows, dim floats each, in chunks that never move (readers hold no lock).
class RowArena {
 public:
  explicit RowArena(uint32_t dim);
  uint32_t dim() const { return dim_; }
  float* row(uint32_t r) const;
  // A row for the writer: a freed one, or a new one (chunks added as needed).
  uint32_t take();
  void free(uint32_t r) { free_.push_back(r); }
  uint64_t rows_in_use() const { return next_ - free_.size(); }

 private:
  static constexpr uint32_t kChunkShift = 16;  // 65536 rows a chunk
  static constexpr uint32_t kMaxChunks = 1u << 16;
  uint32_t dim_;
  uint32_t next_ = 0;
  std::vector<uint32_t> free_;
  std::unique_ptr<std::atomic<float*>[]> chunks_;
  std::vector<std::unique_ptr<float[]>> owned_;
};

class ServedRows {
 public:
  // tables: name -> dim.
  explicit ServedRows(const std::map<std::string, uint32_t>& tables);
  ~ServedRows();

  // Reader: the rows of keys in table at the current version into out (n x dim); keys without
  // a row get fill(key, row) (zeros when fill is empty). Returns the version read, or false
  // (no such table).
  bool lookup(const std::string& table, const int64_t* keys, size_t n, float* out,
              const std::function<void(int64_t, float*)>& fill, uint64_t* version) const;
  // Reader: the version served now.
  uint64_t version() const;

  // Writer (one thread): moves to version with these changes (tables absent from changes do
  // not change). Returns once the changes are in the base (step 3 above). After a throw (memory,
  // CAPACITY_EXCEEDED) the rows may be served at the new version or the old, but must not be
  // applied to again: the caller loads them anew.
  void apply(uint64_t version, std::map<std::string, TableChanges> changes);
  // Writer, before the first apply and before readers use it: rows put straight into the base
  // of table (a version's whole rows, as a follower loads them); then finish_load publishes
  // them as version.
  void load(const std::string& table, const int64_t* keys, const float* values, size_t n);
  void finish_load(uint64_t version);
  // Writer: rows of table in its base (after apply, the rows served).
  uint64_t rows(const std::string& table) const;

 private:
  struct Overlay;
  struct Base;
  struct TableView;
  struct View;

  std::shared_ptr<const View> current() const;
  // Upserts into a base in place (a new index where the old one is full); returns the index.
  static std::shared_ptr<ConcurrentIndex> merge_upserts(Base& base, const int64_t* keys,
                                                        const float* values, size_t n);
  void publish(std::shared_ptr<const View> view);
  // Step 2's wait: until no reader holds a view older than the current one.
  void wait_for_readers();

  std::map<std::string, std::unique_ptr<Base>> bases_;
  SharedSlot<const View> view_;
  // The release flags of the views replaced since the last step 2.
  std::vector<std::shared_ptr<std::atomic<bool>>> retired_;
};

}  // namespace embstore::serving
