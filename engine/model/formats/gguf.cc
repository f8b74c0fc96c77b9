#include "engine/model/formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace inferd {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 3;
constexpr uint64_t kMaxAlignment = 1u << 16;
// Bounds the memory a hostile file can make the reader allocate: vocabularies are under a million.
constexpr uint64_t kMaxArrayElements = 1u << 24;
constexpr uint64_t kMaxNestedArrays = 1u << 16;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("gguf: ", what));
}

// Reads little-endian values from the file, never past its end.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  absl::Status Read(T* out, const std::string& what) {
    if (remaining() < sizeof(T)) return Bad(absl::StrCat(what, " at byte ", pos_, " runs past the end of the file"));
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, const std::string& what) {
    uint64_t len = 0;
    INFERD_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return Bad(absl::StrCat(what, ": string length ", len, " at byte ", pos_ - 8, " runs past the end of the file (",
                              remaining(), " bytes left)"));
    }
    out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

// The smallest number of bytes one value of this type occupies; 0 for an unknown type.
uint64_t MinValueBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 0;
}

absl::Status ReadValue(Cursor& c, GgufType type, int depth, const std::string& key, GgufValue* v) {
  v->type = type;
  switch (type) {
    case GgufType::kU8: {
      uint8_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      v->u = x;
      break;
    }
    case GgufType::kI8: {
      int8_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      break;
    }
    case GgufType::kU16: {
      uint16_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      v->u = x;
      break;
    }
    case GgufType::kI16: {
      int16_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      break;
    }
    case GgufType::kU32: {
      uint32_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      v->u = x;
      break;
    }
    case GgufType::kI32: {
      int32_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      break;
    }
    case GgufType::kU64: {
      uint64_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->u = x;
      v->i = x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(x);
      break;
    }
    case GgufType::kI64: {
      int64_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->i = x;
      break;
    }
    case GgufType::kF32: {
      float x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->f = x;
      break;
    }
    case GgufType::kF64: {
      double x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      v->f = x;
      break;
    }
    case GgufType::kBool: {
      uint8_t x;
      INFERD_RETURN_IF_ERROR(c.Read(&x, key));
      if (x > 1) return Bad(absl::StrCat("metadata '", key, "': bool value ", int{x}, " is neither 0 nor 1"));
      v->i = x;
      break;
    }
    case GgufType::kString:
      return c.ReadString(&v->s, key);
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) return Bad(absl::StrCat("metadata '", key, "': arrays nested too deep"));
      uint32_t elem;
      uint64_t n;
      INFERD_RETURN_IF_ERROR(c.Read(&elem, key));
      INFERD_RETURN_IF_ERROR(c.Read(&n, key));
      const uint64_t min = MinValueBytes(static_cast<GgufType>(elem));
      if (min == 0) return Bad(absl::StrCat("metadata '", key, "': unknown array element type ", elem));
      if (n > c.remaining() / min) {
        return Bad(absl::StrCat("metadata '", key, "': array of ", n, " elements cannot fit in the ", c.remaining(),
                                " bytes left in the file"));
      }
      if (n > kMaxArrayElements) {
        return Bad(absl::StrCat("metadata '", key, "': array of ", n, " elements; at most ", kMaxArrayElements));
      }
      if (elem == static_cast<uint32_t>(GgufType::kArray) && n > kMaxNestedArrays) {
        return Bad(absl::StrCat("metadata '", key, "': ", n, " nested arrays; at most ", kMaxNestedArrays));
      }
      v->elem_type = static_cast<GgufType>(elem);
      for (uint64_t k = 0; k < n; ++k) {
        GgufValue e;
        INFERD_RETURN_IF_ERROR(ReadValue(c, v->elem_type, depth + 1, key, &e));
        if (e.type == GgufType::kString) {
          v->strings.push_back(std::move(e.s));
        } else if (e.type == GgufType::kArray) {
          v->arrays.push_back(std::move(e));
        } else if (e.type == GgufType::kF32 || e.type == GgufType::kF64) {
          v->floats.push_back(e.f);
        } else {
          v->ints.push_back(e.i);
        }
      }
      break;
    }
    default:
      return Bad(absl::StrCat("metadata '", key, "': unknown value type ", static_cast<uint32_t>(type)));
  }
  return absl::OkStatus();
}

}  // namespace

const char* GgufTypeName(GgufType t) {
  static const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
  }
  return absl::StrCat("type ", type);
}

bool GgmlBlockLayout(uint32_t type, int64_t* elems, int64_t* bytes) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      *elems = 1;
      *bytes = 4;
      return true;
    case GgmlType::kF16:
      *elems = 1;
      *bytes = 2;
      return true;
    case GgmlType::kBF16:
      *elems = 1;
      *bytes = 2;
      return true;
    case GgmlType::kQ8_0:
      *elems = 32;
      *bytes = 34;
      return true;
    case GgmlType::kQ4_0:
      *elems = 32;
      *bytes = 18;
      return true;
    case GgmlType::kQ4_1:
      *elems = 32;
      *bytes = 20;
      return true;
    case GgmlType::kQ5_0:
      *elems = 32;
      *bytes = 22;
      return true;
    case GgmlType::kQ4_K:
      *elems = 256;
      *bytes = 144;
      return true;
    case GgmlType::kQ6_K:
      *elems = 256;
      *bytes = 210;
      return true;
  }
  return false;
}

const GgufValue* GgufContents::Find(std::string_view key) const {
  auto it = metadata.find(std::string(key));
  return it == metadata.end() ? nullptr : &it->second;
}

const GgufTensor* GgufContents::FindTensor(std::string_view name) const {
  auto it = tensor_index.find(std::string(name));
  return it == tensor_index.end() ? nullptr : &tensors[it->second];
}

absl::StatusOr<GgufContents> ParseGguf(std::span<const uint8_t> file) {
  Cursor c(file);
  GgufContents g;
  uint32_t magic = 0;
  INFERD_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) return Bad("not a GGUF file (the first 4 bytes are not 'GGUF')");
  INFERD_RETURN_IF_ERROR(c.Read(&g.version, "version"));
  if (g.version != 2 && g.version != 3) {
    return Bad(absl::StrCat("version ", g.version, " is not supported; supported: 2, 3"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  INFERD_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor_count"));
  INFERD_RETURN_IF_ERROR(c.Read(&n_kv, "metadata_kv_count"));
  if (n_kv > c.remaining() / (8 + 4 + 1)) {
    return Bad(absl::StrCat("metadata_kv_count ", n_kv, " cannot fit in a file of ", file.size(), " bytes"));
  }
  if (n_tensors > c.remaining() / (8 + 4 + 4 + 8)) {
    return Bad(absl::StrCat("tensor_count ", n_tensors, " cannot fit in a file of ", file.size(), " bytes"));
  }
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    uint32_t type = 0;
    INFERD_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    INFERD_RETURN_IF_ERROR(c.Read(&type, key));
    if (MinValueBytes(static_cast<GgufType>(type)) == 0) {
      return Bad(absl::StrCat("metadata '", key, "': unknown value type ", type));
    }
    GgufValue v;
    INFERD_RETURN_IF_ERROR(ReadValue(c, static_cast<GgufType>(type), 0, key, &v));
    if (!g.metadata.emplace(key, std::move(v)).second) return Bad(absl::StrCat("metadata key '", key, "' repeats"));
  }
  if (const GgufValue* a = g.Find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || static_cast<uint64_t>(a->i) > kMaxAlignment || (a->i & (a->i - 1)) != 0) {
      return Bad(absl::StrCat("general.alignment must be a power of two integer in [1, ", kMaxAlignment, "]"));
    }
    g.alignment = static_cast<uint64_t>(a->i);
  }
  g.tensors.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor& t = g.tensors[k];
    INFERD_RETURN_IF_ERROR(c.ReadString(&t.name, "tensor name"));
    uint32_t n_dims = 0;
    INFERD_RETURN_IF_ERROR(c.Read(&n_dims, t.name));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Bad(absl::StrCat("tensor '", t.name, "': ", n_dims, " dimensions; allowed 1 to ", kMaxDims));
    }
    t.dims.resize(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      INFERD_RETURN_IF_ERROR(c.Read(&dim, t.name));
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim) {
        return Bad(absl::StrCat("tensor '", t.name, "': dimension ", d, " = ", dim,
                                " is zero or makes the element count overflow"));
      }
      t.dims[d] = static_cast<int64_t>(dim);
      numel *= dim;
    }
    t.numel = static_cast<int64_t>(numel);
    INFERD_RETURN_IF_ERROR(c.Read(&t.type, t.name));
    INFERD_RETURN_IF_ERROR(c.Read(&t.offset, t.name));
    int64_t block_elems = 0, block_bytes = 0;
    if (!GgmlBlockLayout(t.type, &block_elems, &block_bytes)) {
      return Bad(absl::StrCat("tensor '", t.name, "' has type ", GgmlTypeName(t.type),
                              "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K"));
    }
    if (t.dims[0] % block_elems != 0) {
      return Bad(absl::StrCat("tensor '", t.name, "': first dimension ", t.dims[0], " is not a multiple of the ",
                              GgmlTypeName(t.type), " block of ", block_elems));
    }
    const uint64_t blocks = numel / block_elems;
    if (blocks > file.size() / block_bytes) {
      return Bad(absl::StrCat("tensor '", t.name, "': ", numel, " elements are larger than the file"));
    }
    t.size = blocks * block_bytes;
    if (t.offset % g.alignment != 0) {
      return Bad(absl::StrCat("tensor '", t.name, "': offset ", t.offset, " is not a multiple of the alignment ",
                              g.alignment));
    }
    if (!g.tensor_index.emplace(t.name, k).second) return Bad(absl::StrCat("tensor '", t.name, "' repeats"));
  }
  g.data_offset = (c.pos() + g.alignment - 1) / g.alignment * g.alignment;
  if (g.data_offset > file.size()) {
    if (!g.tensors.empty()) return Bad("the data section starts past the end of the file");
    g.data_offset = file.size();  // no tensors: the padding before an empty data section may be left out
  }
  const uint64_t data_size = file.size() - g.data_offset;
  std::vector<const GgufTensor*> by_offset;
  for (const GgufTensor& t : g.tensors) {
    if (t.offset > data_size || t.size > data_size - t.offset) {
      return Bad(absl::StrCat("tensor '", t.name, "': bytes [", t.offset, ", ", t.offset + t.size,
                              ") lie outside the data section of ", data_size, " bytes"));
    }
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    if (by_offset[k - 1]->offset + by_offset[k - 1]->size > by_offset[k]->offset) {
      return Bad(absl::StrCat("tensors '", by_offset[k - 1]->name, "' and '", by_offset[k]->name, "' overlap"));
    }
  }
  return g;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open GGUF file '", path, "'"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path, "' is empty"));
  }
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map '", path, "'"));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = static_cast<const uint8_t*>(map);
  f->map_size_ = st.st_size;
  auto contents = ParseGguf({f->map_, f->map_size_});
  if (!contents.ok()) {
    return absl::Status(contents.status().code(), absl::StrCat(path, ": ", contents.status().message()));
  }
  f->contents_ = std::move(*contents);
  return f;
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

std::span<const uint8_t> GgufFile::Bytes(const GgufTensor& t) const {
  return {map_ + contents_.data_offset + t.offset, t.size};
}

}  // namespace inferd
