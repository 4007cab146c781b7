#pragma once

// An intrusive doubly linked list of T, through T's `prev` and `next` members: O(1) push,
// unlink and move-to-back with no allocation. An index shard keeps its reservations in one
// (oldest deadline first) and its committed objects in another (least recently used first).
// Thread-compatible: the owner's lock guards it.

namespace kvpool::master {

template <typename T>
class ObjectList {
 public:
  T* front() const { return head_; }
  static T* Next(const T* node) { return node->next; }

  void PushBack(T* node) {
    node->prev = tail_;
    node->next = nullptr;
    (tail_ ? tail_->next : head_) = node;
    tail_ = node;
  }

  void Unlink(T* node) {
    (node->prev ? node->prev->next : head_) = node->next;
    (node->next ? node->next->prev : tail_) = node->prev;
    node->prev = node->next = nullptr;
  }

  void MoveToBack(T* node) {
    if (node == tail_) return;
    Unlink(node);
    PushBack(node);
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

}  // namespace kvpool::master
