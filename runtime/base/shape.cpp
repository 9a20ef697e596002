#include "shape.hpp"

#include <set>
#include <sstream>

namespace xmesh {

int64_t Slice::size() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

int64_t Slice::rank_at(const std::vector<int64_t>& coords) const {
  if (coords.size() != sizes.size())
    throw ShapeError(ShapeError::ValueErr, "expected " + std::to_string(sizes.size()) + " coordinates, got " +
                                               std::to_string(coords.size()));
  int64_t r = offset;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= sizes[i])
      throw ShapeError(ShapeError::IndexErr, "coordinate " + std::to_string(coords[i]) +
                                                 " out of range for a dimension of size " + std::to_string(sizes[i]));
    r += coords[i] * strides[i];
  }
  return r;
}

std::vector<int64_t> Slice::ranks() const {
  std::vector<int64_t> out;
  int64_t n = size();
  out.reserve(static_cast<size_t>(n));
  std::vector<int64_t> c(sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = offset;
    for (size_t d = 0; d < c.size(); ++d) r += c[d] * strides[d];
    out.push_back(r);
    for (size_t d = c.size(); d-- > 0;) {
      if (++c[d] < sizes[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

Shape::Shape(std::vector<std::string> labels, Slice slice) : labels_(std::move(labels)), slice_(std::move(slice)) {
  if (labels_.size() != slice_.sizes.size() || labels_.size() != slice_.strides.size())
    throw ShapeError(ShapeError::ValueErr, "shape has " + std::to_string(labels_.size()) + " labels but " +
                                               std::to_string(slice_.sizes.size()) + " sizes");
  std::set<std::string> seen;
  for (auto& l : labels_) {
    if (l.empty()) throw ShapeError(ShapeError::ValueErr, "dimension names must not be empty");
    if (!seen.insert(l).second) throw ShapeError(ShapeError::ValueErr, "duplicate dimension name '" + l + "'");
  }
  for (auto s : slice_.sizes)
    if (s < 0) throw ShapeError(ShapeError::ValueErr, "dimension sizes must not be negative");
}

Shape Shape::dense(const std::vector<std::string>& labels, const std::vector<int64_t>& sizes) {
  Slice s;
  s.sizes = sizes;
  s.strides.assign(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) s.strides[i - 1] = s.strides[i] * sizes[i];
  for (auto n : sizes)
    if (n <= 0) throw ShapeError(ShapeError::ValueErr, "dimension sizes must be positive, got " + std::to_string(n));
  return Shape(labels, s);
}

int64_t Shape::dim_index(const std::string& label) const {
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == label) return static_cast<int64_t>(i);
  return -1;
}

static std::string label_list(const std::vector<std::string>& labels) {
  std::string s = "(";
  for (size_t i = 0; i < labels.size(); ++i) s += (i ? ", '" : "'") + labels[i] + "'";
  return s + ")";
}

int64_t Shape::dim_size(const std::string& label) const {
  int64_t i = dim_index(label);
  if (i < 0) throw ShapeError(ShapeError::KeyErr, "mesh has no dimension '" + label + "'; its dimensions are " + label_list(labels_));
  return slice_.sizes[static_cast<size_t>(i)];
}

std::map<std::string, int64_t> Shape::sizes() const {
  std::map<std::string, int64_t> m;
  for (size_t i = 0; i < labels_.size(); ++i) m[labels_[i]] = slice_.sizes[i];
  return m;
}

Shape Shape::select(const std::string& label, int64_t start, int64_t stop, int64_t step) const {
  int64_t d = dim_index(label);
  if (d < 0)
    throw ShapeError(ShapeError::TypeErr, "mesh has no dimension '" + label + "'; its dimensions are " + label_list(labels_));
  if (step <= 0) throw ShapeError(ShapeError::ValueErr, "slice step must be positive, got " + std::to_string(step));
  int64_t size = slice_.sizes[d];
  if (start < 0) start = 0;
  if (stop > size) stop = size;
  int64_t n = stop > start ? (stop - start + step - 1) / step : 0;
  if (n == 0)
    throw ShapeError(ShapeError::IndexErr, "slice of dimension '" + label + "' (size " + std::to_string(size) +
                                               ") selects nothing");
  Slice s = slice_;
  s.offset += start * s.strides[d];
  s.sizes[d] = n;
  s.strides[d] *= step;
  return Shape(labels_, s);
}

Shape Shape::at(const std::string& label, int64_t index) const {
  int64_t d = dim_index(label);
  if (d < 0)
    throw ShapeError(ShapeError::TypeErr, "mesh has no dimension '" + label + "'; its dimensions are " + label_list(labels_));
  int64_t size = slice_.sizes[d];
  if (index < 0 || index >= size)
    throw ShapeError(ShapeError::IndexErr, "index " + std::to_string(index) + " out of range for dimension '" + label +
                                               "' of size " + std::to_string(size));
  Slice s;
  s.offset = slice_.offset + index * slice_.strides[d];
  std::vector<std::string> labels;
  for (size_t i = 0; i < labels_.size(); ++i) {
    if (static_cast<int64_t>(i) == d) continue;
    labels.push_back(labels_[i]);
    s.sizes.push_back(slice_.sizes[i]);
    s.strides.push_back(slice_.strides[i]);
  }
  return Shape(labels, s);
}

Shape Shape::flatten(const std::string& name) const {
  std::vector<int64_t> dense(slice_.sizes.size(), 1);
  for (size_t i = dense.size(); i-- > 1;) dense[i - 1] = dense[i] * slice_.sizes[i];
  if (dense != slice_.strides)
    throw ShapeError(ShapeError::ValueErr, "cannot flatten a sparse mesh " + to_string() +
                                               ": its ranks are not contiguous (slice it less, or flatten before slicing)");
  Slice s;
  s.offset = slice_.offset;
  s.sizes = {size()};
  s.strides = {1};
  return Shape({name}, s);
}

Shape Shape::split(const std::map<std::string, std::vector<std::string>>& splits,
                   std::map<std::string, int64_t> constraints) const {
  for (auto& kv : splits)
    if (dim_index(kv.first) < 0)
      throw ShapeError(ShapeError::TypeErr, "mesh has no dimension '" + kv.first + "'; its dimensions are " + label_list(labels_));
  std::vector<std::string> names;
  Slice out;
  out.offset = slice_.offset;
  for (size_t i = 0; i < labels_.size(); ++i) {
    const std::string& name = labels_[i];
    int64_t size = slice_.sizes[i], stride = slice_.strides[i];
    auto it = splits.find(name);
    std::vector<std::string> to = it == splits.end() ? std::vector<std::string>{name} : it->second;
    if (to.empty()) throw ShapeError(ShapeError::ValueErr, "dimension '" + name + "' cannot be split into nothing");
    int64_t known = 1;
    std::string unknown;
    for (auto& t : to) {
      auto c = constraints.find(t);
      if (c != constraints.end()) {
        if (c->second <= 0) throw ShapeError(ShapeError::ValueErr, "size of '" + t + "' must be positive");
        known *= c->second;
      } else if (unknown.empty()) {
        unknown = t;
      } else {
        throw ShapeError(ShapeError::ValueErr, "cannot infer the sizes of both '" + unknown + "' and '" + t +
                                                   "'; give at least one of them, e.g. " + t + "=2");
      }
    }
    if (!unknown.empty()) {
      if (size % known != 0)
        throw ShapeError(ShapeError::ValueErr, "dimension '" + name + "' of size " + std::to_string(size) +
                                                   " is not evenly divided by " + std::to_string(known));
      constraints[unknown] = size / known;
    } else if (known != size) {
      throw ShapeError(ShapeError::ValueErr, "dimension '" + name + "' of size " + std::to_string(size) +
                                                 " cannot be split into sizes multiplying to " + std::to_string(known));
    }
    std::vector<int64_t> new_sizes;
    for (auto& t : to) {
      new_sizes.push_back(constraints[t]);
      constraints.erase(t);
    }
    std::vector<int64_t> new_strides(new_sizes.size());
    int64_t st = stride;
    for (size_t k = new_sizes.size(); k-- > 0;) {
      new_strides[k] = st;
      st *= new_sizes[k];
    }
    for (size_t k = 0; k < to.size(); ++k) {
      for (auto& n : names)
        if (n == to[k]) throw ShapeError(ShapeError::ValueErr, "duplicate dimension name '" + to[k] + "'");
      names.push_back(to[k]);
      out.sizes.push_back(new_sizes[k]);
      out.strides.push_back(new_strides[k]);
    }
  }
  if (!constraints.empty()) {
    std::vector<std::string> unused;
    for (auto& kv : constraints) unused.push_back(kv.first);
    throw ShapeError(ShapeError::ValueErr, "unused size constraints " + label_list(unused) +
                                               ": they name no dimension produced by the split");
  }
  return Shape(names, out);
}

Shape Shape::rename(const std::map<std::string, std::string>& names) const {
  std::map<std::string, std::vector<std::string>> splits;
  for (auto& kv : names) splits[kv.first] = {kv.second};
  return split(splits, {});
}

std::vector<int64_t> Shape::coords_of(int64_t local_index) const {
  if (local_index < 0 || local_index >= size())
    throw ShapeError(ShapeError::IndexErr, "index " + std::to_string(local_index) + " out of range for a mesh of size " +
                                               std::to_string(size()));
  std::vector<int64_t> c(slice_.sizes.size());
  for (size_t d = c.size(); d-- > 0;) {
    c[d] = local_index % slice_.sizes[d];
    local_index /= slice_.sizes[d];
  }
  return c;
}

int64_t Shape::local_index_of(int64_t global_rank) const {
  // Ranks are few (one per proc); a scan is simpler than inverting the strides.
  auto rs = ranks();
  for (size_t i = 0; i < rs.size(); ++i)
    if (rs[i] == global_rank) return static_cast<int64_t>(i);
  return -1;
}

std::string Shape::to_string() const {
  std::ostringstream os;
  os << "{";
  for (size_t i = 0; i < labels_.size(); ++i) os << (i ? ", '" : "'") << labels_[i] << "': " << slice_.sizes[i];
  os << "}";
  return os.str();
}

nlohmann::json Shape::to_json() const {
  return {{"labels", labels_}, {"offset", slice_.offset}, {"sizes", slice_.sizes}, {"strides", slice_.strides}};
}

Shape Shape::from_json(const nlohmann::json& j) {
  try {
    Slice s;
    s.offset = j.at("offset").get<int64_t>();
    s.sizes = j.at("sizes").get<std::vector<int64_t>>();
    s.strides = j.at("strides").get<std::vector<int64_t>>();
    return Shape(j.at("labels").get<std::vector<std::string>>(), s);
  } catch (const nlohmann::json::exception& e) {
    throw ShapeError(ShapeError::ValueErr, std::string("malformed shape: ") + e.what());
  }
}

}  // namespace xmesh
