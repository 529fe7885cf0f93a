#include "table/dense_table.hpp"

#include <cstring>

#include "table/io/save_dir.hpp"

namespace gpubox::table {
namespace {

// The binary forms are the in-memory bytes, documented as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "binary save forms assume little-endian");

constexpr const char* kDenseKind = "dense";
constexpr const char* kBlocksFile = "blocks";

void put_u64(uint64_t v, std::string* out) { out->append(reinterpret_cast<const char*>(&v), 8); }
void put_string(const std::string& s, std::string* out) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out->append(reinterpret_cast<const char*>(&n), 4);
  out->append(s);
}
void put_floats(const std::vector<float>& v, std::string* out) {
  put_u64(v.size(), out);
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Bounds-checked reader over the blocks file; errors name the file and the offset.
class Reader {
 public:
  Reader(const std::string& data, std::string where) : data_(data), where_(std::move(where)) {}
  bool done() const { return at_ == data_.size(); }
  Status u64(uint64_t* v) { return bytes(v, 8, "count"); }
  Status string(std::string* s) {
    uint32_t n = 0;
    GPUBOX_RETURN_IF_ERROR(bytes(&n, 4, "name length"));
    if (n > data_.size() - at_) return fail("name");
    s->assign(data_, at_, n);
    at_ += n;
    return Status::OK();
  }
  Status floats(std::vector<float>* v) {
    uint64_t n = 0;
    GPUBOX_RETURN_IF_ERROR(u64(&n));
    if (n > (data_.size() - at_) / sizeof(float)) return fail("values");
    v->resize(n);
    return bytes(v->data(), n * sizeof(float), "values");
  }

 private:
  Status bytes(void* out, std::size_t n, const char* what) {
    if (n > data_.size() - at_) return fail(what);
    std::memcpy(out, data_.data() + at_, n);
    at_ += n;
    return Status::OK();
  }
  Status fail(const char* what) {
    return Status::Corruption(where_ + ": truncated " + what + " at byte " + std::to_string(at_));
  }
  const std::string& data_;
  std::string where_;
  std::size_t at_ = 0;
};

}  // namespace

void DenseTable::put(const std::string& name, DenseBlock block) {
  MutexLock lock(mu_);
  blocks_[name] = std::move(block);
}

std::optional<DenseBlock> DenseTable::get(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = blocks_.find(name);
  if (it == blocks_.end()) return std::nullopt;
  return it->second;
}

bool DenseTable::erase(const std::string& name) {
  MutexLock lock(mu_);
  return blocks_.erase(name) > 0;
}

std::vector<std::string> DenseTable::names() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, block] : blocks_) out.push_back(name);
  return out;
}

std::size_t DenseTable::size() const {
  MutexLock lock(mu_);
  return blocks_.size();
}

Status DenseTable::save(const std::string& path) const {
  std::string data;
  uint64_t count = 0;
  {
    MutexLock lock(mu_);
    count = blocks_.size();
    put_u64(count, &data);
    for (const auto& [name, block] : blocks_) {
      put_string(name, &data);
      put_floats(block.values, &data);
      put_u64(block.state.size(), &data);
      for (const auto& [state_name, state] : block.state) {
        put_string(state_name, &data);
        put_floats(state, &data);
      }
    }
  }
  auto staged = io::StagedSave::begin(env_, path, kDenseKind);
  if (!staged.ok()) return staged.status().with_context("save dense " + path);
  GPUBOX_RETURN_IF_ERROR((*staged)->add_file(kBlocksFile, data, count).with_context("save dense"));
  return (*staged)->commit(kDenseKind, {{"format", "1"}}).with_context("save dense " + path);
}

Status DenseTable::load(const std::string& path) {
  auto manifest = io::read_manifest(env_, path, kDenseKind);
  if (!manifest.ok()) return manifest.status().with_context("load dense");
  if (manifest->files.size() != 1 || manifest->files[0].name != kBlocksFile) {
    return Status::Corruption("load dense " + path + ": MANIFEST does not list '" + kBlocksFile +
                              "' alone");
  }
  auto data = io::read_verified(env_, path, manifest->files[0]);
  if (!data.ok()) return data.status().with_context("load dense");
  Reader in(*data, path + "/" + kBlocksFile);
  std::map<std::string, DenseBlock> blocks;
  uint64_t count = 0;
  GPUBOX_RETURN_IF_ERROR(in.u64(&count));
  for (uint64_t b = 0; b < count; ++b) {
    std::string name;
    DenseBlock block;
    uint64_t states = 0;
    GPUBOX_RETURN_IF_ERROR(in.string(&name));
    GPUBOX_RETURN_IF_ERROR(in.floats(&block.values));
    GPUBOX_RETURN_IF_ERROR(in.u64(&states));
    for (uint64_t s = 0; s < states; ++s) {
      std::string state_name;
      GPUBOX_RETURN_IF_ERROR(in.string(&state_name));
      GPUBOX_RETURN_IF_ERROR(in.floats(&block.state[state_name]));
    }
    blocks[name] = std::move(block);
  }
  if (!in.done() || count != manifest->files[0].records) {
    return Status::Corruption("load dense " + path + "/" + kBlocksFile +
                              ": block count or trailing bytes do not match the MANIFEST");
  }
  MutexLock lock(mu_);
  blocks_ = std::move(blocks);
  return Status::OK();
}

}  // namespace gpubox::table
