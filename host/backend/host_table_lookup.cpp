// The host table's lookup: each key's row found in the index, missing admitted keys given new
// rows (initialized on the pool's threads), the rows found touched on a table that evicts, and
// the rows copied out (streaming stores for an output past the caches).
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "host/admission/admission.hpp"
#include "host/backend/host_table.hpp"

namespace embstore::host_backend {
namespace {

// Rows of a batch whose output exceeds the caches are written with streaming stores: the
// output cannot stay cached anyway, and this saves reading every destination line first.
constexpr size_t kStreamingOutputBytes = size_t{8} << 20;

template <bool Streaming>
void copy_row(float* dst, const float* src, uint32_t dim) {
#if defined(__SSE2__)
  if constexpr (Streaming) {  // dst is 16-byte aligned and dim a multiple of 4
    for (uint32_t c = 0; c < dim; c += 4) {
      _mm_stream_ps(dst + c, src ? _mm_loadu_ps(src + c) : _mm_setzero_ps());
    }
    return;
  }
#endif
  if (src) {
    std::memcpy(dst, src, dim * sizeof(float));
  } else {
    std::memset(dst, 0, dim * sizeof(float));
  }
}

}  // namespace

void HostTable::lookup(const int64_t* keys, size_t n, float* out, bool insert, uint64_t step,
                       void*) {
  std::lock_guard lock(mutex_);
  rows_scratch_.resize(n);
  uint32_t* rows = rows_scratch_.data();
  find_rows(keys, n, rows);
  const SettleAtExit settle_at_exit{this};
  if (tiered_) {
    begin_tier_call();
    bring_up(rows, n);
  }
  pending_pos_.clear();
  if (insert) insert_missing(keys, n, rows, step);
  const uint32_t dim = spec().dim;
  const bool streaming = n * dim * sizeof(float) >= kStreamingOutputBytes && dim % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const uint32_t* frames = frames_of(rows, n);
  streaming ? copy_rows<true>(frames, n, out) : copy_rows<false>(frames, n, out);
  if (!pending_pos_.empty()) read_pending(keys, out);
}

// rows: frames (kNoRow: zeros).
template <bool Streaming>
void HostTable::copy_rows(const uint32_t* rows, size_t n, float* out) {
  const uint32_t dim = spec().dim;
  const row::ArenaRef arena = arena_;
  pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (i + kAhead < end && rows[i + kAhead] != row::kNoRow) {
        prefetch_row(arena.row(rows[i + kAhead]), dim);
      }
      copy_row<Streaming>(out + i * dim, rows[i] == row::kNoRow ? nullptr : arena.row(rows[i]),
                          dim);
    }
#if defined(__SSE2__)
    if constexpr (Streaming) _mm_sfence();  // streaming stores are weakly ordered
#endif
  });
}

void HostTable::find_rows(const int64_t* keys, size_t n, uint32_t* rows) {
  const row::IndexRef index = index_;
  pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (i + kAhead < end) __builtin_prefetch(&index.slots[index.home(keys[i + kAhead])]);
      rows[i] = index.find(keys[i]);
    }
  });
}

// Gives each missing admitted key one new row, in order of first appearance; the positions
// of keys still pending go to pending_pos_. On a table that evicts, the rows found are
// touched. Either every new row fits under the row limit or nothing is inserted or touched
// (the keys stay counted).
void HostTable::insert_missing(const int64_t* keys, size_t n, uint32_t* rows, uint64_t step) {
  missing_pos_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] == row::kNoRow) missing_pos_.push_back(static_cast<uint32_t>(i));
  }
  if (AdmissionCounter* admission = ledger_.admission()) {
    // Every occurrence counts, in batch order; the positions of admitted keys stay.
    size_t kept = 0;
    for (const uint32_t i : missing_pos_) {
      if (admission->count(keys[i], step)) {
        missing_pos_[kept++] = i;
      } else {
        pending_pos_.push_back(i);
      }
    }
    missing_pos_.resize(kept);
  }
  const uint64_t missing = missing_pos_.size();
  if (missing == 0) {
    if (spec().frees_rows()) touch_rows(rows, n, step);
    return;
  }
  const uint64_t limit = row::row_limit(spec().max_capacity);
  uint64_t evict = 0;
  if (rows_ + missing > limit) {
    // Near the limit only: count distinct new keys exactly (duplicates share a row), and
    // choose the rows that make room for them when the table evicts (victims_): a refused call
    // makes no frames for its new rows.
    missing_keys_.clear();
    for (const uint32_t i : missing_pos_) missing_keys_.push_back(keys[i]);
    const uint64_t fresh = distinct_keys(missing_keys_);
    if (rows_ + fresh > limit) {
      if (!spec().evicts()) fail_over_limit(spec(), fresh, rows_, "new rows", "inserted");
      evict = rows_ + fresh - limit;
      const uint64_t candidates = pick_least_recent(evict, step, rows, n);
      if (candidates < evict) fail_no_room(spec(), evict, candidates, step);
    }
  }
  if (tiered_) {
    // Frames and row ids for every new row (at most `missing`) before anything is evicted or
    // inserted: moving rows down may fail, and a new row must never be in the index without its
    // frame.
    make_frames(missing);
    reserve_frames_for(missing);
    reserve_rows(std::min<uint64_t>(next_row_ + missing, row::kMaxRows));
  }
  if (evict != 0) evict_rows(victims_);
  // Only once there is room: a refused call touches nothing.
  if (spec().frees_rows()) touch_rows(rows, n, step);

  const uint64_t fresh_from = next_row_;  // rows from here on were never used: zero pages
  new_rows_.clear();
  for (size_t j = 0; j < missing; ++j) {
    if (j + kAhead < missing) {
      __builtin_prefetch(&index_.slots[index_.home(keys[missing_pos_[j + kAhead]])]);
    }
    const size_t i = missing_pos_[j];
    bool added = false;
    rows[i] = find_or_add_row(keys[i], &added);
    if (added) new_rows_.push_back(rows[i]);
  }
  inserted_ += new_rows_.size();
  admitted_ += new_rows_.size();
  if (AdmissionCounter* admission = ledger_.admission()) {
    for (const uint32_t r : new_rows_) admission->admitted(arena_.row_meta(r)->key);
  }
  if (tiered_) {
    for (const uint32_t r : new_rows_) place_new_row(r);
  }

  const TableSpec& s = spec();
  const row::ArenaRef arena = arena_;
  const bool tiered = tiered_;
  const HomeRef homes = home_;
  uint64_t* dirty = dirty_.data();
  const uint32_t* new_rows = new_rows_.data();
  const bool concurrent = pool_.size() > 1;
  const bool zero_state = row::initial_state_is_zero(s.opt);
  pool_.parallel_for(new_rows_.size(), kGrain, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const uint32_t r = new_rows[k];
      row::RowMeta* meta = arena.row_meta(r);
      float* values = arena.row(tiered ? *homes.at(r) : r);
      row::init_row(s.init, meta->key, s.dim, values);
      // A fresh row id of a tiered table may get a used frame.
      if (!zero_state || r < fresh_from || tiered) row::init_state(s.opt, s.dim, values + s.dim);
      meta->step = step;
      concurrent ? row::bitmap_set<true>(dirty, r) : row::bitmap_set<false>(dirty, r);
    }
  });
}

// Pending keys read the values their row would start with.
void HostTable::read_pending(const int64_t* keys, float* out) {
  const row::InitParams init = spec().init;
  const uint32_t dim = spec().dim;
  const uint32_t* pos = pending_pos_.data();
  pool_.parallel_for(pending_pos_.size(), kGrain, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      row::init_row(init, keys[pos[k]], dim, out + size_t{pos[k]} * dim);
    }
  });
}

// A training lookup touches the rows it finds (they must not be evicted to make room for
// the keys beside them). Duplicates store the same value, hence relaxed atomics.
void HostTable::touch_rows(const uint32_t* rows, size_t n, uint64_t step) {
  const row::ArenaRef arena = arena_;
  pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (rows[i] != row::kNoRow) {
        __atomic_store_n(&arena.row_meta(rows[i])->step, step, __ATOMIC_RELAXED);
      }
    }
  });
}

}  // namespace embstore::host_backend
