// Save records of sparse rows, and their text and binary encodings.
//
// Two record kinds:
//  - model (base and delta saves): show, click, slot, embed_w, mf_size, embedx_w[mf_dim] —
//    what serving and a warm start need. Optimizer state is not saved; loading a model record
//    into a new row re-creates the state at its initial values (init_row / init_state).
//  - full row (checkpoint saves): all floats of the row, optimizer state and unseen_days
//    included, bit-exact; with 16-bit storage (RowLayout::packed) the row unpacked to fp32
//    values (RowLayout::unpacked, convert_row), so its floats are the fp32 layout's stride.
// Records hold the embedding values as fp32 whatever hyper_parameters.sparse_storage is: the
// 16-bit values widen exactly, so writing a record back into the same storage gives the same
// row, and a record loaded into another storage is converted (rounded to nearest even when
// narrowing).
// Text: one record per line, `key v0 v1 ...`, key in decimal, floats in the shortest form that
// reads back to the same bits. Binary: little-endian uint64 key then the float32 values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/host_table_types.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

enum class RecordKind { kModel, kFullRow };

// Whether a model record's slot field (a float) is a slot id: finite, a whole number, in int32's
// range. parse_records refuses a model record whose slot is not (naming file and record), so a
// corrupt or hostile save cannot reach a cast that is undefined for it.
bool is_slot_value(float slot);

// Floats of the record of a row of `layout` (the row's own: RowLayout::of_row).
int32_t record_floats(RecordKind kind, const RowLayout& layout);

// Writes the record of `row` into rec[0 .. record_floats).
void row_to_record(RecordKind kind, const RowLayout& layout, const float* row, float* rec);

// Writes a record into `row`. A full record overwrites the row. A model record overwrites the
// model fields; when `existing` is false the row is first created by init_row, and an embedx part
// that the record has and the row had not gets its initial optimizer state. `layout`: the row's
// own (a full record's mf_dim, a model record's slot's width).
void record_to_row(RecordKind kind, const RowLayout& layout, const AccessorConfig& cfg,
                   uint64_t key, const float* rec, bool existing, float* row);

void append_record(SaveForm form, uint64_t key, const float* rec, int32_t floats, std::string* out);
void append_key(SaveForm form, uint64_t key, std::string* out);

// How long each record of a part file is. With slot_dims a row's width, and so its record's
// length, follows from its slot (a model record's third float; a full row records its mf_dim):
// `floats(head)` is the length of the record starting with the `prefix` floats at `head`, and
// no record is longer than `max`. With one width every record is `max` floats.
struct RecordShape {
  RecordKind kind = RecordKind::kModel;
  RowLayout record;     // the widest class's layout
  AccessorConfig cfg;   // its slot_dims
  bool uniform = true;  // one width class
  int32_t fixed = -1;   // >= 0: every record is this many floats, whatever the above say

  int32_t max() const { return fixed >= 0 ? fixed : record_floats(kind, record); }
  int32_t prefix() const;
  int32_t floats(const float* head) const;
};
RecordShape record_shape(RecordKind kind, const AccessorConfig& cfg);

// Parses a whole part file. `where` names the file in errors (with the line for text, the byte
// offset for binary). Records come back `shape.max()` floats apart, a shorter one zero-padded.
// A record (shape.fixed < 0; a model record's or a full row's) whose slot is not is_slot_value
// is corrupt.
Status parse_records(SaveForm form, const std::string& data, const RecordShape& shape,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs);
// Where a chunk of a part file starts (its byte offset and the lines before it), and whether it
// runs to the file's end.
struct RecordChunk {
  uint64_t byte = 0;
  uint64_t line = 0;
  bool last = true;
};
// What parse_record_chunk took: the bytes of the whole records at the chunk's front, and (text)
// their lines.
struct ChunkTaken {
  std::size_t bytes = 0;
  uint64_t lines = 0;
};
// parse_records over data[0, n), one chunk of a file read in order: appends the records that
// are whole in it (a record cut at its end is left for the next chunk, unless `chunk.last`,
// where it is the truncation parse_records reports); errors name the file's line or byte.
StatusOr<ChunkTaken> parse_record_chunk(SaveForm form, const char* data, std::size_t n,
                                        const RecordShape& shape, const std::string& where,
                                        const RecordChunk& chunk, std::vector<uint64_t>* keys,
                                        std::vector<float>* recs);
// Records of `floats` floats each.
Status parse_records(SaveForm form, const std::string& data, int32_t floats,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs);
Status parse_keys(SaveForm form, const std::string& data, const std::string& where,
                  std::vector<uint64_t>* keys);

}  // namespace gpubox::table
