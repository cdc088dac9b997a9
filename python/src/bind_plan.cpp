// Bindings: plans (format/plan.h), the allocators (alloc/make_plan.h), the
// quantizers a plan prescribes and fake quantization (cache/plan_codecs.h,
// cache/fake_quant_cache.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>

#include "bind_common.h"
#include "ratekv/alloc/make_plan.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/format/calib_stats.h"
#include "ratekv/format/plan.h"

namespace ratekv::py {

void bind_plan(nb::module_& m) {
  nb::class_<Plan>(m, "Plan",
                   "A compression plan: the key and value codec of every (layer, KV head) "
                   "(include/ratekv/format/plan.h, docs/plan_format.md).")
      .def_static("load", &Plan::load, nb::arg("path"),
                  "Reads and validates a plan file; RatekvError names the file and JSON field.")
      .def("save", &Plan::save, nb::arg("path"))
      .def_static(
          "from_json", [](const std::string& s, const std::string& name) {
            // nlohmann's own message ("[json.exception.parse_error.101] ...") reached Python as a RuntimeError.
            nlohmann::json j;
            try {
              j = nlohmann::json::parse(s);
            } catch (const nlohmann::json::parse_error& e) {
              fail("{}: text is not valid JSON ({}); expected the JSON object `ratekv plan` writes "
                   "(docs/plan_format.md)",
                   name, e.byte > s.size() ? fmt::format("it ends early, after {} bytes", s.size())
                                           : fmt::format("syntax error at byte {} of {}", e.byte, s.size()));
            } catch (const nlohmann::json::out_of_range&) {  // 406: a number literal beyond double's range
              fail("{}: text is not valid JSON (a number beyond the range of a double); expected the JSON object "
                   "`ratekv plan` writes (docs/plan_format.md)",
                   name);
            }
            return Plan::from_json(j, name);
          },
          nb::arg("text"), nb::arg("name") = "plan",
          "A plan from JSON text; RatekvError for invalid JSON (the byte offset) or a bad field.")
      .def("to_json", [](const Plan& p) { return p.to_json().dump(1); })
      .def("validate", &Plan::validate, nb::arg("name") = "plan")
      .def(
          "validate_against",
          [](const Plan& p, const ModelConfig& cfg, const std::string& name) {
            p.validate_against(cache::plan_target(cfg), name);
          },
          nb::arg("config"), nb::arg("name") = "plan",
          "Raises RatekvError listing every mismatch (arch, layers, KV heads, head_dim, RoPE layout).")
      .def_ro("method", &Plan::method)
      .def_prop_ro("arch", [](const Plan& p) { return p.model.arch; })
      .def_prop_ro("n_layers", [](const Plan& p) { return p.model.n_layers; })
      .def_prop_ro("n_kv_heads", [](const Plan& p) { return p.model.n_kv_heads; })
      .def_prop_ro("head_dim", [](const Plan& p) { return p.model.head_dim; })
      .def_prop_ro("rope_layout", [](const Plan& p) { return p.model.rope_layout; })
      .def_ro("fp16_window", &Plan::fp16_window)
      .def_ro("sink_tokens", &Plan::sink_tokens)
      .def_prop_ro("achieved",
                   [](const Plan& p) {
                     const auto a = p.achieved();
                     nb::dict d;
                     d["k"] = a.k; d["v"] = a.v; d["total"] = a.total; d["k_code"] = a.k_code; d["v_code"] = a.v_code;
                     return d;
                   },
                   "effective and code bits per element (metadata included in k, v, total)")
      .def(
          "codec_kinds",
          [](const Plan& p) {
            std::vector<std::string> kinds;
            for (const auto& layer : p.layers)
              for (const auto& h : layer) {
                kinds.push_back(codec_kind_name(h.key.kind));
                kinds.push_back(codec_kind_name(h.value.kind));
              }
            return kinds;
          },
          "codec kind of every (layer, head, side), row-major")
      .def("summary", [](const Plan& p) { return alloc::plan_summary(p); });

  nb::class_<alloc::PlanRequest>(m, "PlanRequest", "What make_plan builds (include/ratekv/alloc/make_plan.h).")
      .def(nb::init<>())
      .def_rw("method", &alloc::PlanRequest::method)
      .def_rw("k_bits", &alloc::PlanRequest::k_bits)
      .def_rw("v_bits", &alloc::PlanRequest::v_bits)
      .def_rw("avg_bits", &alloc::PlanRequest::avg_bits)
      .def_rw("budget_unit", &alloc::PlanRequest::budget_unit)
      .def_rw("b_min", &alloc::PlanRequest::b_min)
      .def_rw("b_max", &alloc::PlanRequest::b_max)
      .def_rw("seed", &alloc::PlanRequest::seed)
      .def_rw("fp16_window", &alloc::PlanRequest::fp16_window)
      .def_rw("sink_tokens", &alloc::PlanRequest::sink_tokens)
      .def_rw("quantizer", &alloc::PlanRequest::quantizer)
      .def_rw("v_quantizer", &alloc::PlanRequest::v_quantizer)
      .def_rw("curves_from", &alloc::PlanRequest::curves_from)
      .def_rw("sensitivity", &alloc::PlanRequest::sensitivity)
      .def_rw("group_size", &alloc::PlanRequest::group_size)
      .def_rw("stats_file", &alloc::PlanRequest::stats_file);

  m.def(
      "make_plan", [](const CalibStats& st, const alloc::PlanRequest& rq) { return alloc::make_plan(st, rq); },
      nb::arg("stats"), nb::arg("request"), nb::call_guard<nb::gil_scoped_release>(),
      "Builds and validates a plan with the C++ allocators (the library side of `ratekv plan`).");

  nb::class_<cache::PlanCodecs>(m, "PlanCodecs",
                                "The quantizers of a plan built for a model (include/ratekv/cache/plan_codecs.h).")
      .def(
          "__init__",
          [](cache::PlanCodecs* self, const Plan& plan, const ModelConfig& cfg, const std::string& name) {
            new (self) cache::PlanCodecs(plan, cfg, name);
          },
          nb::arg("plan"), nb::arg("config"), nb::arg("name") = "plan",
          "Validates the plan and that it matches the model (RoPE layout included); RatekvError lists each mismatch.")
      .def_prop_ro("plan", [](const cache::PlanCodecs& c) { return c.plan(); })
      .def_prop_ro("config", [](const cache::PlanCodecs& c) { return c.config(); })
      .def(
          "layer_is_vq",
          [](const cache::PlanCodecs& c, int layer, int side) {
            check(layer >= 0 && layer < c.config().n_layers, "layer {} outside 0..{}", layer, c.config().n_layers - 1);
            return c.layer_is_vq(layer, static_cast<cache::KVSide>(side));
          },
          nb::arg("layer"), nb::arg("side"));

  m.def(
      "fake_quant_sequence",
      [](const cache::PlanCodecs& c, int layer, int side, F32In x, F32Out out, std::optional<F32In> k_pre,
         std::optional<I32In> pos, int window, int sink) {
        const ModelConfig& cfg = c.config();
        check(layer >= 0 && layer < cfg.n_layers, "fake_quantize: layer {} outside 0..{}", layer, cfg.n_layers - 1);
        check(side == 0 || side == 1, "fake_quantize: side {} must be 0 (key) or 1 (value)", side);
        check_shape(x, "fake_quantize: x", {-1, cfg.n_kv_heads, cfg.head_dim});
        const int64_t T = static_cast<int64_t>(x.shape(0));
        check_shape(out, "fake_quantize: out", {T, cfg.n_kv_heads, cfg.head_dim});
        const float* kp = nullptr;
        const int32_t* ps = nullptr;
        if (k_pre) {
          check_shape(*k_pre, "fake_quantize: k_pre", {T, cfg.n_kv_heads, cfg.head_dim});
          kp = k_pre->data();
        }
        if (pos) {
          check_shape(*pos, "fake_quantize: positions", {T});
          ps = pos->data();
        }
        check(window >= 0 && sink >= 0, "fake_quantize: window {} and sink {} must be ≥ 0", window, sink);
        nb::gil_scoped_release rel;
        cache::fake_quant_sequence(c, layer, static_cast<cache::KVSide>(side), x.data(), kp, ps, T, window, sink,
                                   out.data());
      },
      nb::arg("codecs"), nb::arg("layer"), nb::arg("side"), nb::arg("x"), nb::arg("out"), nb::arg("k_pre") = nb::none(),
      nb::arg("pos") = nb::none(), nb::arg("window") = 0, nb::arg("sink") = 0,
      "What FakeQuantKVCache stores for one side of one layer after one append of all T tokens: "
      "x, out (T, n_kv_heads, head_dim) float32 (cache/fake_quant_cache.h fake_quant_sequence).");
}

}  // namespace ratekv::py
