// RoPE-logit MAE, attention KL and logit NMSE by query position of quantized
// keys (eval/logit_error.h).
#include "ratekv/eval/logit_error.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ratekv/common/error.h"

namespace ratekv::eval {

namespace {

// log-softmax of scale·s[0..len) into out (double accumulation).
void log_softmax(const float* s, int64_t len, float scale, float* out) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < len; ++j) mx = std::max(mx, double{scale} * s[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < len; ++j) sum += std::exp(double{scale} * s[j] - mx);
  const double lse = mx + std::log(sum);
  for (int64_t j = 0; j < len; ++j) out[j] = static_cast<float>(double{scale} * s[j] - lse);
}

}  // namespace

int position_bucket(int64_t pos) {
  check(pos >= 0, "logit error: query position {} must be ≥ 0", pos);
  if (pos < kFirstPositionBucket) return 0;
  int b = 1;
  for (int64_t end = 2 * kFirstPositionBucket; pos >= end; end *= 2) ++b;
  return b;
}

int64_t position_bucket_begin(int b) {
  check(b >= 0 && b <= 40, "logit error: position bucket {} out of range 0..40", b);
  return b == 0 ? 0 : kFirstPositionBucket << (b - 1);
}

LogitErrorReference::LogitErrorReference(const float* q, const float* k, int64_t n, int n_heads, int n_kv_heads,
                                         int head_dim, float scale, int64_t query_stride)
    : n_(n), stride_(query_stride), H_(n_heads), Hkv_(n_kv_heads), d_(head_dim), scale_(scale) {
  check(n >= 1 && n_heads >= 1 && n_kv_heads >= 1 && head_dim >= 1 && n_heads % n_kv_heads == 0,
        "logit error: bad shape (n {}, heads {}, kv heads {}, head_dim {})", n, n_heads, n_kv_heads, head_dim);
  check(scale > 0 && std::isfinite(scale), "logit error: scale {} must be finite and positive", scale);
  check(query_stride >= 1, "logit error: query stride {} must be ≥ 1", query_stride);
  rows_ = (n - 1) / stride_ + 1;
  const int64_t qrow = int64_t{H_} * d_, krow = int64_t{Hkv_} * d_;
  q_.resize(rows_ * qrow);
  for (int64_t r = 0; r < rows_; ++r) std::memcpy(&q_[r * qrow], q + r * stride_ * qrow, sizeof(float) * qrow);
  s_.assign(static_cast<size_t>(H_) * rows_ * n_, 0.0f);
  logp_.assign(s_.size(), 0.0f);
  const int ratio = H_ / Hkv_;
#pragma omp parallel for schedule(dynamic)
  for (int g = 0; g < H_; ++g) {
    float* S = &s_[static_cast<size_t>(g) * rows_ * n_];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows_), static_cast<int>(n_), d_, 1.0f,
                &q_[int64_t{g} * d_], static_cast<int>(qrow), k + int64_t{g / ratio} * d_, static_cast<int>(krow),
                0.0f, S, static_cast<int>(n_));
    float* LP = &logp_[static_cast<size_t>(g) * rows_ * n_];
    for (int64_t r = 0; r < rows_; ++r) log_softmax(S + r * n_, r * stride_ + 1, scale_, LP + r * n_);
  }
}

LogitErrorSums LogitErrorReference::compare(const float* khat) const {
  const int64_t qrow = int64_t{H_} * d_, krow = int64_t{Hkv_} * d_;
  const int ratio = H_ / Hkv_;
  std::vector<LogitErrorSums> per(H_);
#pragma omp parallel for schedule(dynamic)
  for (int g = 0; g < H_; ++g) {
    std::vector<float> Sh(static_cast<size_t>(rows_) * n_), lq(n_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows_), static_cast<int>(n_), d_, 1.0f,
                &q_[int64_t{g} * d_], static_cast<int>(qrow), khat + int64_t{g / ratio} * d_, static_cast<int>(krow),
                0.0f, Sh.data(), static_cast<int>(n_));
    const float* S = &s_[static_cast<size_t>(g) * rows_ * n_];
    const float* LP = &logp_[static_cast<size_t>(g) * rows_ * n_];
    LogitErrorSums acc;
    acc.by_position.resize(static_cast<size_t>(position_bucket((rows_ - 1) * stride_)) + 1);
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t len = r * stride_ + 1;
      const float* s = S + r * n_;
      const float* sh = Sh.data() + r * n_;
      double a = 0.0, e2 = 0.0, r2 = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        const double e = double{sh[j]} - s[j];
        a += std::fabs(e);
        e2 += e * e;
        r2 += double{s[j]} * s[j];
      }
      PositionSums& ps = acc.by_position[static_cast<size_t>(position_bucket(r * stride_))];
      ps.sq_err += e2;
      ps.sq_ref += r2;
      ps.pairs += len;
      log_softmax(sh, len, scale_, lq.data());
      const float* lp = LP + r * n_;
      double kl = 0.0;
      for (int64_t j = 0; j < len; ++j) kl += std::exp(double{lp[j]}) * (double{lp[j]} - lq[j]);
      acc.abs_sum += a;
      acc.pairs += len;
      acc.kl_sum += std::max(kl, 0.0);
      acc.rows += 1;
    }
    per[g] = acc;
  }
  LogitErrorSums out;
  for (const auto& p : per) out.merge(p);
  return out;
}

LogitErrorSums logit_error(const float* q, const float* k, const float* khat, int64_t n, int n_heads, int n_kv_heads,
                           int head_dim, float scale, int64_t query_stride) {
  return LogitErrorReference(q, k, n, n_heads, n_kv_heads, head_dim, scale, query_stride).compare(khat);
}

}  // namespace ratekv::eval
