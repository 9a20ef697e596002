// Named-dimension shapes with Monarch's semantics: a Shape is labels plus a Slice (offset,
// sizes, strides) into the ranks of the mesh it was cut from. Slicing never moves data; it
// only picks which global ranks a handle addresses.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xmesh {

// Errors carry the Python exception type they become.
struct ShapeError : std::runtime_error {
  enum Type { TypeErr, IndexErr, ValueErr, KeyErr };
  Type type;
  ShapeError(Type t, const std::string& what) : std::runtime_error(what), type(t) {}
};

struct Slice {
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t size() const;
  // Global rank of the element at these coordinates.
  int64_t rank_at(const std::vector<int64_t>& coords) const;
  // Global ranks in row-major order of the coordinates.
  std::vector<int64_t> ranks() const;
  bool operator==(const Slice& o) const {
    return offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
};

class Shape {
 public:
  Shape() = default;
  Shape(std::vector<std::string> labels, Slice slice);
  // Dense row-major shape over ranks 0..N-1.
  static Shape dense(const std::vector<std::string>& labels, const std::vector<int64_t>& sizes);

  const std::vector<std::string>& labels() const { return labels_; }
  const Slice& slice() const { return slice_; }
  int64_t size() const { return slice_.size(); }
  int64_t ndim() const { return static_cast<int64_t>(labels_.size()); }
  int64_t dim_index(const std::string& label) const;  // -1 if absent
  int64_t dim_size(const std::string& label) const;   // KeyErr if absent
  std::map<std::string, int64_t> sizes() const;

  // Keeps the dimension: elements start, start+step, ... < stop (already normalized, step>0).
  Shape select(const std::string& label, int64_t start, int64_t stop, int64_t step) const;
  // Drops the dimension, fixing it at index.
  Shape at(const std::string& label, int64_t index) const;
  Shape flatten(const std::string& name) const;
  // splits: dimension -> new names; constraints: new name -> size (one name per split may be
  // left to be inferred). Monarch's split(); rename is a split into one name.
  Shape split(const std::map<std::string, std::vector<std::string>>& splits,
              std::map<std::string, int64_t> constraints) const;
  Shape rename(const std::map<std::string, std::string>& names) const;

  std::vector<int64_t> ranks() const { return slice_.ranks(); }
  // Coordinates of the element at this local index (row-major position within the shape).
  std::vector<int64_t> coords_of(int64_t local_index) const;
  // Local index of a global rank, or -1 if the shape does not contain it.
  int64_t local_index_of(int64_t global_rank) const;
  std::string to_string() const;  // "{'hosts': 2, 'gpus': 4}"

  nlohmann::json to_json() const;
  static Shape from_json(const nlohmann::json& j);  // ValueErr on malformed input
  bool operator==(const Shape& o) const { return labels_ == o.labels_ && slice_ == o.slice_; }

 private:
  std::vector<std::string> labels_;
  Slice slice_;
};

}  // namespace xmesh
