// Validation of embstore_table_config_t: every field is checked here, once, so backends can
// trust their TableSpec.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>

#include "cuda/row/admission.h"
#include "cuda/row/index.h"
#include "host/error.hpp"
#include "host/table/table.hpp"
#include "io/format/layout.hpp"

namespace embstore {
namespace {

void check_finite(const char* field, float v) {
  if (!std::isfinite(v)) fail(EMBSTORE_INVALID_ARGUMENT, "table {} is not finite", field);
}

void check_non_negative(const char* field, float v) {
  check_finite(field, v);
  if (v < 0.0f) fail(EMBSTORE_INVALID_ARGUMENT, "table {} is negative ({})", field, v);
}

}  // namespace

// Table and attachment names become file names in checkpoints (io/format/layout.hpp).
void check_name(const char* what, const char* name) {
  if (name == nullptr) fail(EMBSTORE_INVALID_ARGUMENT, "{} name is NULL", what);
  if (std::string why = io::name_problem(what, name); !why.empty()) {
    fail(EMBSTORE_INVALID_ARGUMENT, "{}", why);
  }
}

TableSpec make_table_spec(const embstore_table_config_t& config) {
  // Callers built before the 0.2 fields (or the 0.3 ones) get their defaults.
  constexpr size_t kBaseSize = offsetof(embstore_table_config_t, evict_idle_seconds);
  if (config.struct_size < kBaseSize) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "table config struct_size is {}, expected {}: fill it with embstore_table_config_init",
         config.struct_size, sizeof(embstore_table_config_t));
  }
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  std::memcpy(&c, &config, std::min(config.struct_size, sizeof(c)));
  check_name("table", c.name);
  TableSpec s;
  s.name = c.name;
  if (c.dim < 1 || c.dim > 4096) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': dim must be 1..4096, is {}", s.name, c.dim);
  }
  s.dim = c.dim;
  s.initial_capacity = c.initial_capacity == 0 ? 1024 : c.initial_capacity;
  if (s.initial_capacity > row::kMaxRows) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': initial_capacity {} exceeds {} rows", s.name,
         s.initial_capacity, row::kMaxRows);
  }
  if (c.max_capacity != 0 && c.max_capacity < s.initial_capacity) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': max_capacity {} is below initial_capacity {}",
         s.name, c.max_capacity, s.initial_capacity);
  }
  s.max_capacity = c.max_capacity;

  const int optimizer = enum_value(c.optimizer);
  switch (optimizer) {
    case EMBSTORE_OPT_SGD:
    case EMBSTORE_OPT_ADAGRAD:
    case EMBSTORE_OPT_ROWWISE_ADAGRAD:
    case EMBSTORE_OPT_ADAM:
      break;
    default:
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': unknown optimizer {}", s.name, optimizer);
  }
  check_non_negative("learning_rate", c.learning_rate);
  check_non_negative("epsilon", c.epsilon);
  check_non_negative("weight_decay", c.weight_decay);
  check_non_negative("initial_accumulator", c.initial_accumulator);
  check_finite("beta1", c.beta1);
  check_finite("beta2", c.beta2);
  if (optimizer == EMBSTORE_OPT_ADAM) {
    if (c.beta1 < 0.0f || c.beta1 >= 1.0f || c.beta2 < 0.0f || c.beta2 >= 1.0f) {
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': Adam betas must be in [0, 1), are {} and {}",
           s.name, c.beta1, c.beta2);
    }
    if (c.epsilon == 0.0f) {
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': Adam needs epsilon > 0", s.name);
    }
  }
  if ((optimizer == EMBSTORE_OPT_ADAGRAD || optimizer == EMBSTORE_OPT_ROWWISE_ADAGRAD) &&
      c.epsilon == 0.0f && c.initial_accumulator == 0.0f) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "table '{}': Adagrad needs epsilon > 0 or initial_accumulator > 0 (0/0 otherwise)",
         s.name);
  }
  s.opt = row::OptParams{static_cast<row::OptKind>(optimizer),
                         c.learning_rate,
                         c.epsilon,
                         c.beta1,
                         c.beta2,
                         c.weight_decay,
                         c.initial_accumulator};

  check_finite("init_a", c.init_a);
  check_finite("init_b", c.init_b);
  const int init = enum_value(c.init);
  switch (init) {
    case EMBSTORE_INIT_ZEROS:
    case EMBSTORE_INIT_CONSTANT:
      break;
    case EMBSTORE_INIT_UNIFORM:
      if (c.init_b < c.init_a) {
        fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': uniform init needs init_a <= init_b ({} > {})",
             s.name, c.init_a, c.init_b);
      }
      // In the float arithmetic row::init_value_at uses: a + (b - a) * u.
      if (const float span = c.init_b - c.init_a; !std::isfinite(span)) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "table '{}': uniform init's init_b - init_a ({} - {}) overflows a float: every value "
             "would be infinite",
             s.name, c.init_b, c.init_a);
      }
      break;
    case EMBSTORE_INIT_NORMAL:
      if (c.init_b < 0.0f) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "table '{}': normal init needs a standard deviation init_b >= 0, is {}", s.name,
             c.init_b);
      }
      // a + b * z, with |z| below 9 for the polar method's draws (row::standard_normal).
      if (const float reach = std::fabs(c.init_a) + 16.0f * c.init_b; !std::isfinite(reach)) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "table '{}': normal init's |init_a| + 16 init_b overflows a float ({}, {})", s.name,
             c.init_a, c.init_b);
      }
      break;
    default:
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': unknown initializer {}", s.name, init);
  }
  s.init = row::InitParams{static_cast<row::InitKind>(init), c.init_a, c.init_b, c.seed};

  s.admit_after = c.admit_after;
  if (c.admit_bloom_bytes != 0) {
    if (c.admit_after <= 1) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}': admit_bloom_bytes is set but admit_after is {}: nothing to count", s.name,
           c.admit_after);
    }
    if (c.admit_bloom_bytes < row::kBloomMinCells ||
        c.admit_bloom_bytes > EMBSTORE_MAX_ADMIT_BLOOM_BYTES) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}': admit_bloom_bytes must be at least {} and at most {} (16 GiB), is {}",
           s.name, row::kBloomMinCells, uint64_t{EMBSTORE_MAX_ADMIT_BLOOM_BYTES},
           c.admit_bloom_bytes);
    }
    if (c.admit_after > row::kBloomMaxCount) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}': with admit_bloom_bytes, admit_after counts in one-byte counters and must "
           "be at most {}, is {}",
           s.name, row::kBloomMaxCount, c.admit_after);
    }
  }
  s.admit_bloom_bytes = c.admit_bloom_bytes;
  s.evict_idle_steps = c.evict_idle_steps;
  if (!std::isfinite(c.evict_idle_seconds) || c.evict_idle_seconds < 0.0) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': evict_idle_seconds must be finite and >= 0, is {}",
         s.name, c.evict_idle_seconds);
  }
  s.evict_idle_seconds = c.evict_idle_seconds;
  if (c.evict_when_full > 1) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': evict_when_full must be 0 or 1, is {}", s.name,
         c.evict_when_full);
  }
  s.evict_when_full = c.evict_when_full != 0;
  s.device_rows = c.device_rows;
  s.memory_rows = c.memory_rows;
  if (s.memory_rows > row::kMaxRows) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': memory_rows {} exceeds {} rows", s.name,
         s.memory_rows, row::kMaxRows);
  }
  for (const auto& [field, value] : {std::pair{"value_codec", enum_value(c.value_codec)},
                                     std::pair{"state_codec", enum_value(c.state_codec)},
                                     std::pair{"serving_codec", enum_value(c.serving_codec)}}) {
    if (value < 0 || !io::codec_is_known(static_cast<uint32_t>(value))) {
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}': unknown {} {} (NONE, LOSSLESS, BF16 or INT8)",
           s.name, field, value);
    }
  }
  s.value_codec = static_cast<io::Codec>(c.value_codec);
  s.state_codec = static_cast<io::Codec>(c.state_codec);
  s.serving_codec = static_cast<io::Codec>(c.serving_codec);
  if (s.state_codec == io::Codec::kInt8) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "table '{}': state_codec INT8 is refused: optimizer state spans orders of magnitude "
         "within a row, which one scale per row cannot keep (use LOSSLESS or BF16)",
         s.name);
  }
  return s;
}

embstore_table_config_t to_config(const TableSpec& s) {
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = s.name.c_str();
  c.dim = s.dim;
  c.initial_capacity = s.initial_capacity;
  c.max_capacity = s.max_capacity;
  c.optimizer = static_cast<embstore_optimizer_t>(s.opt.kind);
  c.learning_rate = s.opt.lr;
  c.epsilon = s.opt.eps;
  c.beta1 = s.opt.beta1;
  c.beta2 = s.opt.beta2;
  c.weight_decay = s.opt.weight_decay;
  c.initial_accumulator = s.opt.initial_accumulator;
  c.init = static_cast<embstore_init_t>(s.init.kind);
  c.init_a = s.init.a;
  c.init_b = s.init.b;
  c.seed = s.init.seed;
  c.admit_after = s.admit_after;
  c.evict_idle_steps = s.evict_idle_steps;
  c.evict_idle_seconds = s.evict_idle_seconds;
  c.evict_when_full = s.evict_when_full ? 1 : 0;
  c.admit_bloom_bytes = s.admit_bloom_bytes;
  c.device_rows = s.device_rows;
  c.memory_rows = s.memory_rows;
  c.value_codec = static_cast<embstore_codec_t>(s.value_codec);
  c.state_codec = static_cast<embstore_codec_t>(s.state_codec);
  c.serving_codec = static_cast<embstore_codec_t>(s.serving_codec);
  return c;
}

void fail_over_limit(const TableSpec& spec, uint64_t added, uint64_t live, const char* what,
                     const char* undone) {
  fail(EMBSTORE_CAPACITY_EXCEEDED,
       "table '{}': {} {} on top of {} would pass the limit of {} rows (max_capacity {}); "
       "nothing was {}",
       spec.name, added, what, live, row::row_limit(spec.max_capacity), spec.max_capacity, undone);
}

void fail_no_room(const TableSpec& spec, uint64_t need, uint64_t candidates, uint64_t step) {
  fail(EMBSTORE_CAPACITY_EXCEEDED,
       "table '{}': {} rows must be evicted to stay within max_capacity {}, but only {} were "
       "neither read by this call nor touched in the current step {}; nothing was inserted or "
       "evicted",
       spec.name, need, spec.max_capacity, candidates, step);
}

namespace {

[[noreturn]] void fail_no_moves(const TableSpec& spec) {
  fail(EMBSTORE_INTERNAL, "table '{}': moves rows between tables, but is itself a stack",
       spec.name);
}

}  // namespace

uint64_t Table::live_rows() { fail_no_moves(spec_); }
void Table::find_held(const int64_t*, size_t, uint8_t*) { fail_no_moves(spec_); }
void Table::take_rows(const int64_t*, size_t, MovedRows*) { fail_no_moves(spec_); }
void Table::take_coldest(uint64_t, uint64_t, const int64_t*, size_t, MovedRows*) {
  fail_no_moves(spec_);
}
void Table::reserve_put(uint64_t) { fail_no_moves(spec_); }
void Table::put_rows(const MovedRows&) { fail_no_moves(spec_); }
uint64_t Table::list_coldest(uint64_t, uint64_t, const int64_t*, size_t, std::vector<RowAge>*) {
  fail_no_moves(spec_);
}
uint64_t Table::evict_keys(const int64_t*, size_t) { fail_no_moves(spec_); }
uint64_t Table::count_admission(const int64_t*, size_t, uint64_t, bool) { fail_no_moves(spec_); }

}  // namespace embstore
