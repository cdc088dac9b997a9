// Bindings: model configuration, RoPE layout, GGUF tokenizer (model/).
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>

#include <filesystem>
#include <optional>

#include "bind_common.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/tokenizer.h"
#include "ratekv/quant/lloyd_max.h"

namespace ratekv::py {

namespace {

/// A GGUF file's tokenizer with the file's add_bos flag (as the CLI reads it).
struct GgufTokenizer {
  Tokenizer tok;
  bool add_bos;
  explicit GgufTokenizer(const std::string& path)
      : GgufTokenizer(GgufFile::open(path)) {}
  explicit GgufTokenizer(const GgufFile& f)
      : tok(Tokenizer::from_gguf(f)),
        add_bos(f.has("tokenizer.ggml.add_bos_token") && f.get_bool("tokenizer.ggml.add_bos_token")) {}
};

}  // namespace

void bind_config(nb::module_& m) {
  nb::enum_<RopeLayout>(m, "RopeLayout", "Which channels form a RoPE block (model/model.h).")
      .value("interleaved", RopeLayout::Interleaved, "block i = channels (2i, 2i+1): GGUF 'llama'")
      .value("neox", RopeLayout::NeoX, "block i = channels (i, i + d/2): HF transformers, GGUF 'qwen2'/'gemma3'");

  nb::class_<ModelConfig>(m, "ModelConfig",
                          "Hyper-parameters of a decoder the plans and statistics are checked against "
                          "(include/ratekv/model/model.h).")
      .def(nb::init<>())
      .def_rw("arch", &ModelConfig::arch)
      .def_rw("n_layers", &ModelConfig::n_layers)
      .def_rw("n_heads", &ModelConfig::n_heads)
      .def_rw("n_kv_heads", &ModelConfig::n_kv_heads)
      .def_rw("head_dim", &ModelConfig::head_dim)
      .def_rw("d_model", &ModelConfig::d_model)
      .def_rw("d_ff", &ModelConfig::d_ff)
      .def_rw("n_vocab", &ModelConfig::n_vocab)
      .def_rw("n_ctx_train", &ModelConfig::n_ctx_train)
      .def_rw("rope_theta", &ModelConfig::rope_theta)
      .def_rw("rms_eps", &ModelConfig::rms_eps)
      .def_rw("rope_layout", &ModelConfig::rope_layout)
      .def_rw("attn_scale", &ModelConfig::attn_scale)
      .def_rw("sliding_window", &ModelConfig::sliding_window)
      .def_rw("layer_sliding", &ModelConfig::layer_sliding)
      .def("validate", &ModelConfig::validate, nb::arg("source") = "config",
           "Checks the fields; raises RatekvError naming `source` and the field.")
      .def("attention_scale", &ModelConfig::attention_scale)
      .def("kv_bytes_per_token_fp16", &ModelConfig::kv_bytes_per_token_fp16)
      .def_static(
          "from_gguf",
          [](const std::filesystem::path& path) { return ModelConfig::from_gguf(GgufFile::open(path.string())); },
          nb::arg("path"), "Reads and validates the config of a GGUF file (path: str or os.PathLike).")
      .def("__repr__", [](const ModelConfig& c) {
        return fmt::format("ModelConfig(arch='{}', n_layers={}, n_heads={}, n_kv_heads={}, head_dim={}, rope_layout='{}')",
                           c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, rope_layout_name(c.rope_layout));
      });

  m.def("rope_layout_for_arch", &rope_layout_for_arch, nb::arg("arch"),
        "The GGUF channel layout of an architecture (docs/design.md §1); raises for an unknown one.");
  m.def("rope_pairs", &rope_pairs, nb::arg("layout"), nb::arg("head_dim"),
        "The two channels of every RoPE block: [(a_i, b_i)] for i < head_dim/2.");
  m.def(
      "lloyd_max_distortion", [](int m, int bits) { return quant::lloyd_max_codebook(m, bits).distortion; },
      nb::arg("dim"), nb::arg("bits"),
      "Unit-vector distortion E‖u − û‖² of TurboQuant-MSE at `bits` in dimension `dim` (docs/design.md §2).");

  nb::class_<GgufTokenizer>(m, "Tokenizer", "The GGUF tokenizer of the C++ runtime (model/tokenizer.h).")
      .def("__init__",
           [](GgufTokenizer* t, const std::filesystem::path& p) { new (t) GgufTokenizer(p.string()); },
           nb::arg("gguf_path"), "Reads the tokenizer of a GGUF file (gguf_path: str or os.PathLike).")
      .def_ro("add_bos", &GgufTokenizer::add_bos, "the file's tokenizer.ggml.add_bos_token")
      .def(
          "encode",
          [](const GgufTokenizer& t, const nb::str& text, std::optional<bool> add_bos) {
            Py_ssize_t n = 0;
            const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
            if (utf8 == nullptr) {  // a lone surrogate ('\udcff') has no UTF-8 form
              PyErr_Clear();
              fail("Tokenizer.encode: text is not encodable as UTF-8 (it holds a lone surrogate code point)");
            }
            return t.tok.encode(std::string(utf8, static_cast<size_t>(n)), add_bos.value_or(t.add_bos));
          },
          nb::arg("text"), nb::arg("add_bos") = nb::none(),
          "Text → token ids, exactly as `ratekv calibrate -f` tokenizes (add_bos None: the file's flag). Raises "
          "RatekvError for text with a lone surrogate (no UTF-8 form).")
      .def(
          "decode",
          [](const GgufTokenizer& t, const std::vector<int32_t>& ids) {
            const std::string s = t.tok.decode(ids);
            PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
            if (o == nullptr) throw nb::python_error();
            return nb::steal<nb::str>(o);
          },
          nb::arg("ids"),
          "Token ids → text. Bytes that are no whole UTF-8 character (a token holding part of one, as when "
          "decoding token by token) become U+FFFD, as transformers' decode gives them; decode_bytes returns the "
          "raw bytes, to join before decoding.")
      .def(
          "decode_bytes",
          [](const GgufTokenizer& t, const std::vector<int32_t>& ids) {
            const std::string s = t.tok.decode(ids);
            return nb::bytes(s.data(), s.size());
          },
          nb::arg("ids"), "Token ids → the bytes their pieces spell (UTF-8 only once whole characters are joined).")
      .def_prop_ro("n_vocab", [](const GgufTokenizer& t) { return t.tok.n_vocab(); });
}

}  // namespace ratekv::py
