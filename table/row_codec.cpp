#include "table/row_codec.hpp"

#include <charconv>
#include <cmath>
#include <cstring>

#include "common/error.hpp"

namespace gpubox::table {
namespace {

// The binary forms are the in-memory bytes, documented as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "binary save forms assume little-endian");

constexpr int32_t kModelFixed = 5;  // show, click, slot, embed_w, mf_size

const char* skip_spaces(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
  return p;
}

}  // namespace

bool is_slot_value(float slot) {
  // Finite and integral, in int32's range (2^31 is a float; it is the first value out of range).
  return std::isfinite(slot) && slot == std::trunc(slot) && slot >= -2147483648.0f &&
         slot < 2147483648.0f;
}

int32_t record_floats(RecordKind kind, const RowLayout& layout) {
  return kind == RecordKind::kModel ? kModelFixed + layout.mf_dim : layout.unpacked().stride();
}

void row_to_record(RecordKind kind, const RowLayout& layout, const float* row, float* rec) {
  if (kind == RecordKind::kFullRow) {
    if (layout.packed()) {
      convert_row(row, layout, rec, layout.unpacked());
    } else {
      std::memcpy(rec, row, sizeof(float) * layout.stride());
    }
    return;
  }
  rec[0] = row[RowLayout::kShow];
  rec[1] = row[RowLayout::kClick];
  rec[2] = row[layout.slot()];
  rec[3] = read_embed_w(row, layout);
  rec[4] = row[layout.mf_size()];
  for (int32_t i = 0; i < layout.mf_dim; ++i) rec[kModelFixed + i] = read_embedx_w(row, layout, i);
}

void record_to_row(RecordKind kind, const RowLayout& layout, const AccessorConfig& cfg,
                   uint64_t key, const float* rec, bool existing, float* row) {
  if (kind == RecordKind::kFullRow) {
    if (layout.packed()) {
      convert_row(rec, layout.unpacked(), row, layout);
    } else {
      std::memcpy(row, rec, sizeof(float) * layout.stride());
    }
    return;
  }
  GPUBOX_EXPECTS(is_slot_value(rec[2]), "record_to_row: the model record of key ", key,
                 " has slot ", rec[2], ", not a whole number in int32's range");
  if (!existing) init_row(row, layout, cfg, key, static_cast<int32_t>(rec[2]));
  row[RowLayout::kShow] = rec[0];
  row[RowLayout::kClick] = rec[1];
  row[layout.slot()] = rec[2];
  write_embed_w(row, layout, rec[3]);
  if (rec[4] > 0.0f && !(row[layout.mf_size()] > 0.0f)) {
    detail::init_state(row + layout.embedx_state(), layout.embedx_state_dim, cfg.optimizer);
  }
  row[layout.mf_size()] = rec[4];
  for (int32_t i = 0; i < layout.mf_dim; ++i) write_embedx_w(row, layout, i, rec[kModelFixed + i]);
}

RecordShape record_shape(RecordKind kind, const AccessorConfig& cfg) {
  RecordShape shape;
  shape.kind = kind;
  shape.record = record_layout(cfg);
  shape.cfg = cfg;
  shape.uniform = width_classes(cfg).count == 1;
  return shape;
}

int32_t RecordShape::prefix() const {
  if (uniform || fixed >= 0) return 0;
  return kind == RecordKind::kModel ? 3 : record.mf_dim_offset() + 1;
}

int32_t RecordShape::floats(const float* head) const {
  if (uniform || fixed >= 0) return max();
  if (kind == RecordKind::kModel && !is_slot_value(head[2])) return -1;
  const float width = kind == RecordKind::kModel
                          ? static_cast<float>(slot_mf_dim(cfg, static_cast<int32_t>(head[2])))
                          : head[record.mf_dim_offset()];
  // A width no class has (or not a width at all) makes the record unreadable: -1.
  if (!(width >= 0.0f && width <= static_cast<float>(record.mf_dim)) ||
      width != static_cast<float>(static_cast<int32_t>(width)) ||
      width_classes(cfg).class_of(static_cast<int32_t>(width)) < 0) {
    return -1;
  }
  return record_floats(kind,
                       RowLayout::make(record.kind, static_cast<int32_t>(width), record.storage));
}

void append_record(SaveForm form, uint64_t key, const float* rec, int32_t floats,
                   std::string* out) {
  if (form == SaveForm::kBinary) {
    out->append(reinterpret_cast<const char*>(&key), sizeof(key));
    out->append(reinterpret_cast<const char*>(rec), sizeof(float) * floats);
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), key);
  out->append(buf, r.ptr);
  for (int32_t i = 0; i < floats; ++i) {
    buf[0] = ' ';
    r = std::to_chars(buf + 1, buf + sizeof(buf), rec[i]);
    out->append(buf, r.ptr);
  }
  out->push_back('\n');
}

void append_key(SaveForm form, uint64_t key, std::string* out) {
  if (form == SaveForm::kBinary) {
    out->append(reinterpret_cast<const char*>(&key), sizeof(key));
    return;
  }
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), key);
  out->append(buf, r.ptr);
  out->push_back('\n');
}

namespace {

// What parse_record_chunk checks of every record, in either form: its slot (a model record's
// third float, a full row's slot field) becomes a row's int32 slot (cast wherever the row is
// read) and, for a model record with slot_dims, decides its length: a value that is not one
// (corrupt or hostile file) is refused here, before any cast. Records of a fixed length
// (shape.fixed) are neither.
struct RecordChecks {
  RecordChecks(const RecordShape& shape, const std::string& where)
      : where(where),
        has_slot(shape.fixed < 0),
        slot_at(shape.kind == RecordKind::kModel ? 2 : shape.record.slot()),
        what(shape.kind == RecordKind::kModel ? ": the model record of key "
                                              : ": the full-row record of key ") {}

  Status corrupt(const std::string& at, const std::string& why) const {
    return Status::Corruption(where + at + ": " + why);
  }
  Status bad_width(uint64_t key, const std::string& at) const {
    return corrupt(at, "the record of key " + std::to_string(key) +
                           " has a width that this config's hyper_parameters.slot_dims does " +
                           "not give its slot (a save made with other slot_dims?)");
  }
  // The slot value at `values[slot_at]` checked, when records carry one.
  Status slot(uint64_t key, const std::string& at, const float* values) const {
    if (!has_slot || is_slot_value(values[slot_at])) return Status::OK();
    char text[32];
    const auto r = std::to_chars(text, text + sizeof(text), values[slot_at]);
    return Status::Corruption(where + at + what + std::to_string(key) + " has slot " +
                              std::string(text, r.ptr) +
                              ", not a whole number in int32's range (corrupt file?)");
  }

  const std::string& where;
  const bool has_slot;
  const int32_t slot_at;
  const char* const what;
};

StatusOr<ChunkTaken> parse_binary_chunk(const char* data, std::size_t n, const RecordShape& shape,
                                        const std::string& where, const RecordChunk& chunk,
                                        std::vector<uint64_t>* keys, std::vector<float>* recs) {
  const RecordChecks check(shape, where);
  const int32_t max = shape.max();
  const int32_t prefix = shape.prefix();
  std::size_t at = 0;
  std::vector<float> head(static_cast<std::size_t>(prefix));
  const auto byte = [&](std::size_t pos) { return " at byte " + std::to_string(chunk.byte + pos); };
  while (at < n) {
    const std::size_t left = n - at;
    const std::size_t head_bytes = sizeof(uint64_t) + sizeof(float) * prefix;
    if (left < head_bytes) {
      if (!chunk.last) break;  // the record goes on in the next chunk
      return Status::Corruption(where + ": " + std::to_string(left) +
                                " bytes left at the end, less than a record (truncated)");
    }
    uint64_t key = 0;
    std::memcpy(&key, data + at, sizeof(uint64_t));
    std::memcpy(head.data(), data + at + sizeof(uint64_t), sizeof(float) * prefix);
    if (prefix > check.slot_at) GPUBOX_RETURN_IF_ERROR(check.slot(key, byte(at), head.data()));
    const int32_t floats = shape.floats(head.data());
    if (floats < 0) return check.bad_width(key, "");
    const std::size_t record_bytes = sizeof(uint64_t) + sizeof(float) * floats;
    if (left < record_bytes) {
      if (!chunk.last) break;
      return Status::Corruption(where + ": " + std::to_string(chunk.byte + n) +
                                " bytes is not a whole number of " + std::to_string(record_bytes) +
                                "-byte records (truncated)");
    }
    keys->push_back(key);
    const std::size_t base = recs->size();
    recs->resize(base + max, 0.0f);
    std::memcpy(recs->data() + base, data + at + sizeof(uint64_t), sizeof(float) * floats);
    if (prefix == 0) GPUBOX_RETURN_IF_ERROR(check.slot(key, byte(at), recs->data() + base));
    at += record_bytes;
  }
  return ChunkTaken{at, 0};
}

// One text record `key v0 v1 ...` between p and eol into `values`; its length is known once
// its prefix is read.
Status parse_text_record(const char* p, const char* eol, const RecordShape& shape,
                         const RecordChecks& check, const std::string& at, uint64_t* key,
                         std::vector<float>* values) {
  const int32_t prefix = shape.prefix();
  auto fail = [&](const std::string& why) { return check.corrupt(at, why); };
  const char* q = skip_spaces(p, eol);
  auto r = std::from_chars(q, eol, *key);
  if (r.ec != std::errc()) return fail("bad key");
  q = r.ptr;
  values->clear();
  int32_t floats = prefix == 0 ? shape.max() : -1;
  for (int32_t i = 0; floats < 0 || i < floats; ++i) {
    if (floats < 0 && i == prefix) {
      GPUBOX_RETURN_IF_ERROR(check.slot(*key, at, values->data()));
      floats = shape.floats(values->data());
      if (floats < 0) return check.bad_width(*key, at);
      if (i >= floats) break;
    }
    const char* start = skip_spaces(q, eol);
    const std::string expected =
        floats < 0 ? "at least " + std::to_string(prefix) : std::to_string(floats);
    if (start == q) return fail("expected " + expected + " values");
    float v = 0.0f;
    auto fr = std::from_chars(start, eol, v);
    if (fr.ec != std::errc()) {
      return fail("value " + std::to_string(i) + " is not a number (expected " + expected +
                  " values)");
    }
    values->push_back(v);
    q = fr.ptr;
  }
  if (skip_spaces(q, eol) != eol) return fail("more than " + std::to_string(floats) + " values");
  if (prefix == 0) GPUBOX_RETURN_IF_ERROR(check.slot(*key, at, values->data()));
  return Status::OK();
}

StatusOr<ChunkTaken> parse_text_chunk(const char* data, std::size_t n, const RecordShape& shape,
                                      const std::string& where, const RecordChunk& chunk,
                                      std::vector<uint64_t>* keys, std::vector<float>* recs) {
  const RecordChecks check(shape, where);
  const char* p = data;
  const char* end = p + n;
  uint64_t line = chunk.line;  // lines before this one
  std::vector<float> values;
  while (p < end) {
    const char* eol = static_cast<const char*>(std::memchr(p, '\n', end - p));
    if (eol == nullptr && !chunk.last) break;  // the line goes on in the next chunk
    ++line;
    const std::string at = " line " + std::to_string(line);
    if (eol == nullptr) return check.corrupt(at, "no end of line (truncated)");
    uint64_t key = 0;
    GPUBOX_RETURN_IF_ERROR(parse_text_record(p, eol, shape, check, at, &key, &values));
    keys->push_back(key);
    values.resize(static_cast<std::size_t>(shape.max()), 0.0f);
    recs->insert(recs->end(), values.begin(), values.end());
    p = eol + 1;
  }
  return ChunkTaken{static_cast<std::size_t>(p - data), line - chunk.line};
}

}  // namespace

StatusOr<ChunkTaken> parse_record_chunk(SaveForm form, const char* data, std::size_t n,
                                        const RecordShape& shape, const std::string& where,
                                        const RecordChunk& chunk, std::vector<uint64_t>* keys,
                                        std::vector<float>* recs) {
  if (form == SaveForm::kBinary)
    return parse_binary_chunk(data, n, shape, where, chunk, keys, recs);
  return parse_text_chunk(data, n, shape, where, chunk, keys, recs);
}

Status parse_records(SaveForm form, const std::string& data, const RecordShape& shape,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs) {
  keys->clear();
  recs->clear();
  auto taken =
      parse_record_chunk(form, data.data(), data.size(), shape, where, RecordChunk{}, keys, recs);
  return taken.ok() ? Status::OK() : taken.status();
}

Status parse_records(SaveForm form, const std::string& data, int32_t floats,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs) {
  RecordShape shape;
  shape.fixed = floats;
  return parse_records(form, data, shape, where, keys, recs);
}

Status parse_keys(SaveForm form, const std::string& data, const std::string& where,
                  std::vector<uint64_t>* keys) {
  std::vector<float> none;
  return parse_records(form, data, 0, where, keys, &none);
}

}  // namespace gpubox::table
