#include "table/row_codec.hpp"

#include <charconv>
#include <cstring>

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

Status parse_records(SaveForm form, const std::string& data, int32_t floats,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs) {
  keys->clear();
  recs->clear();
  if (form == SaveForm::kBinary) {
    const std::size_t record_bytes = sizeof(uint64_t) + sizeof(float) * floats;
    if (data.size() % record_bytes != 0) {
      return Status::Corruption(where + ": " + std::to_string(data.size()) +
                                " bytes is not a whole number of " + std::to_string(record_bytes) +
                                "-byte records (truncated)");
    }
    const std::size_t n = data.size() / record_bytes;
    keys->resize(n);
    recs->resize(n * floats);
    for (std::size_t i = 0; i < n; ++i) {
      const char* p = data.data() + i * record_bytes;
      std::memcpy(&(*keys)[i], p, sizeof(uint64_t));
      std::memcpy(recs->data() + i * floats, p + sizeof(uint64_t), sizeof(float) * floats);
    }
    return Status::OK();
  }
  const char* p = data.data();
  const char* end = p + data.size();
  std::size_t line = 0;
  while (p < end) {
    ++line;
    const char* eol = static_cast<const char*>(std::memchr(p, '\n', end - p));
    if (eol == nullptr) {
      return Status::Corruption(where + " line " + std::to_string(line) +
                                ": no end of line (truncated)");
    }
    auto fail = [&](const std::string& why) {
      return Status::Corruption(where + " line " + std::to_string(line) + ": " + why);
    };
    uint64_t key = 0;
    const char* q = skip_spaces(p, eol);
    auto r = std::from_chars(q, eol, key);
    if (r.ec != std::errc()) return fail("bad key");
    keys->push_back(key);
    q = r.ptr;
    for (int32_t i = 0; i < floats; ++i) {
      const char* start = skip_spaces(q, eol);
      if (start == q && i >= 0) return fail("expected " + std::to_string(floats) + " values");
      float v = 0.0f;
      auto fr = std::from_chars(start, eol, v);
      if (fr.ec != std::errc()) {
        return fail("value " + std::to_string(i) + " is not a number (expected " +
                    std::to_string(floats) + " values)");
      }
      recs->push_back(v);
      q = fr.ptr;
    }
    if (skip_spaces(q, eol) != eol) {
      return fail("more than " + std::to_string(floats) + " values");
    }
    p = eol + 1;
  }
  return Status::OK();
}

Status parse_keys(SaveForm form, const std::string& data, const std::string& where,
                  std::vector<uint64_t>* keys) {
  std::vector<float> none;
  return parse_records(form, data, 0, where, keys, &none);
}

}  // namespace gpubox::table
