// The per-signature cache of a fused program: one entry per input signature (dtypes, shapes and
// the data of keyed inputs, Program::signature_of), the least recently used dropped beyond its
// capacity (the option cache_size).
#pragma once

#include <algorithm>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>

namespace ortmlx::engine {

template <class Entry>
class SignatureCache {
 public:
  explicit SignatureCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

  // The entry of `sig`, made the most recently used; null when there is none. Valid until the
  // next insert or erase.
  Entry* find(const std::string& sig) {
    auto it = map_.find(sig);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return &it->second.first;
  }
  bool contains(const std::string& sig) const { return map_.count(sig) != 0; }
  // Adds `e` for `sig` as the most recently used, unless `sig` has an entry already; drops the
  // least recently used entries beyond the capacity.
  void insert(const std::string& sig, Entry e) {
    if (contains(sig)) return;
    lru_.push_front(sig);
    map_.emplace(sig, std::make_pair(std::move(e), lru_.begin()));
    while (map_.size() > capacity_) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  void erase(const std::string& sig) {
    auto it = map_.find(sig);
    if (it == map_.end()) return;
    lru_.erase(it->second.second);
    map_.erase(it);
  }
  size_t size() const { return map_.size(); }
  // Signatures from the most to the least recently used.
  const std::list<std::string>& order() const { return lru_; }

 private:
  size_t capacity_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> map_;
};

}  // namespace ortmlx::engine
