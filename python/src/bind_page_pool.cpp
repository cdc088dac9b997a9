// Bindings: the GPU engine's page pool (include/ratekv/engine/page_pool.h) —
// the page bookkeeping of ratekv.ops' CUDA cache (the same type the engine
// runs). Host code only, so it is bound in every build (CPU tests exercise it);
// the device memory is the caller's (torch tensors; bind_layer takes their
// data_ptr()).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bind_common.h"
#include "ratekv/engine/page_pool.h"

namespace ratekv::py {

void bind_page_pool(nb::module_& m) {
  using engine::PagePool;
  nb::class_<PagePool>(
      m, "PagePool",
      "Pages of a paged KV cache (engine/page_pool.h): the same number of pages in every layer, a free list "
      "(lowest id first, or highest with pages_descending), sequences reserving ceil(max_tokens / 64) pages up "
      "front, page-table rows (int32, stride max_seq_pages) and 64-bit page offsets. The memory is the caller's: "
      "bind_layer(l, tensor.data_ptr(), tensor.numel()) for a uint8 tensor of layer_bytes(l) bytes.")
      .def(
          "__init__",
          [](PagePool* self, std::vector<size_t> page_bytes, std::string label, int64_t pages, int64_t max_seq_pages,
             bool pages_descending, std::string owner) {
            engine::PagePoolOptions o;
            o.pages = pages;
            o.max_seq_pages = max_seq_pages;
            o.pages_descending = pages_descending;
            o.owner = std::move(owner);
            new (self) PagePool(std::move(page_bytes), std::move(label), o);
          },
          nb::arg("page_bytes"), nb::arg("label"), nb::arg("pages"), nb::arg("max_seq_pages"),
          nb::arg("pages_descending") = false, nb::arg("owner") = "page pool",
          "page_bytes: bytes of one page per layer; pages: pages per layer; max_seq_pages: page-table row "
          "stride. Raises RatekvError for empty/zero page sizes or sizes out of range.")
      .def_prop_ro("label", &PagePool::label)
      .def_prop_ro("n_layers", &PagePool::n_layers)
      .def_prop_ro("pages", &PagePool::pages)
      .def_prop_ro("max_seq_pages", &PagePool::max_seq_pages)
      .def_prop_ro("free_pages", &PagePool::free_pages)
      .def_prop_ro("free_tokens", &PagePool::free_tokens)
      .def_prop_ro("n_sequences", &PagePool::n_sequences)
      .def_prop_ro("bound", &PagePool::bound)
      .def("page_bytes", &PagePool::page_bytes, nb::arg("layer"))
      .def("layer_bytes", &PagePool::layer_bytes, nb::arg("layer"), "pages · page_bytes(layer)")
      .def("total_bytes", &PagePool::total_bytes)
      .def("page_offset", &PagePool::page_offset, nb::arg("layer"), nb::arg("page"),
           "Byte offset of a page in its layer's memory (64-bit).")
      .def(
          "bind_layer",
          [](PagePool& p, int layer, uintptr_t base, size_t bytes) {
            p.bind_layer(layer, reinterpret_cast<void*>(base), bytes);
          },
          nb::arg("layer"), nb::arg("base"), nb::arg("nbytes"),
          "Binds a layer's memory (an address, e.g. tensor.data_ptr()); the caller keeps it alive. Raises when "
          "nbytes < layer_bytes(layer).")
      .def(
          "layer_base", [](const PagePool& p, int layer) { return reinterpret_cast<uintptr_t>(p.layer_base(layer)); },
          nb::arg("layer"))
      .def("add_sequence", &PagePool::add_sequence, nb::arg("max_tokens"),
           "Reserves ceil(max_tokens / 64) pages; returns the sequence id. Raises RatekvError, reserving nothing, "
           "when they are not free (naming the request and what is free) or exceed max_seq_pages.")
      .def("remove_sequence", &PagePool::remove_sequence, nb::arg("seq"))
      .def("has_sequence", &PagePool::has_sequence, nb::arg("seq"))
      .def("sequence_ids", &PagePool::sequence_ids)
      .def("seq_pages", &PagePool::seq_pages, nb::arg("seq"))
      .def("capacity", &PagePool::capacity, nb::arg("seq"))
      .def("length", &PagePool::length, nb::arg("seq"))
      .def("set_length", &PagePool::set_length, nb::arg("seq"), nb::arg("tokens"))
      .def("check_room", &PagePool::check_room, nb::arg("seq"), nb::arg("extra"))
      .def(
          "page_table",
          [](const PagePool& p, std::vector<int> ids, I32Out rows) {
            check_shape(rows, "PagePool.page_table: rows",
                        {static_cast<int64_t>(ids.size()), p.max_seq_pages()});
            p.page_table(ids, std::span<int32_t>(rows.data(), rows.size()));
          },
          nb::arg("seqs"), nb::arg("rows"),
          "Writes the page-table rows of `seqs` into rows (len(seqs), max_seq_pages) int32: page ids, then zeros.");
}

}  // namespace ratekv::py
