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
#include "table/accessor/sparse_row.hpp"
#include "table/host_table_types.hpp"

namespace gpubox::table {

enum class RecordKind { kModel, kFullRow };

int32_t record_floats(RecordKind kind, const RowLayout& layout);

// Writes the record of `row` into rec[0 .. record_floats).
void row_to_record(RecordKind kind, const RowLayout& layout, const float* row, float* rec);

// Writes a record into `row`. A full record overwrites the row. A model record overwrites the
// model fields; when `existing` is false the row is first created by init_row, and an embedx part
// that the record has and the row had not gets its initial optimizer state.
void record_to_row(RecordKind kind, const RowLayout& layout, const AccessorConfig& cfg,
                   uint64_t key, const float* rec, bool existing, float* row);

void append_record(SaveForm form, uint64_t key, const float* rec, int32_t floats, std::string* out);
void append_key(SaveForm form, uint64_t key, std::string* out);

// Parses a whole part file. `where` names the file in errors (with the line for text).
Status parse_records(SaveForm form, const std::string& data, int32_t floats,
                     const std::string& where, std::vector<uint64_t>* keys,
                     std::vector<float>* recs);
Status parse_keys(SaveForm form, const std::string& data, const std::string& where,
                  std::vector<uint64_t>* keys);

}  // namespace gpubox::table
