// Op schemas the EP supplies to ORT (OrtEpFactory::GetCustomOpDomains) for ONNX domains that
// ORT's own build does not register: without a schema ORT rejects such a node when it loads the
// model, before any EP is asked. The ops are placeholders; their nodes run only inside the EP's
// fused nodes (GetCapability claims them like any other op).
#pragma once

#include <memory>
#include <vector>

#include "ep/ort_api.h"

namespace ortmlx::ep {

// ai.onnx.preview.training: Adagrad, Adam, Momentum (opset 1; ORT registers them only in its
// training builds).
class SchemaDomains {
 public:
  SchemaDomains();
  ~SchemaDomains();
  SchemaDomains(const SchemaDomains&) = delete;
  SchemaDomains& operator=(const SchemaDomains&) = delete;

  const std::vector<OrtCustomOpDomain*>& domains() const { return domains_; }

 private:
  struct Op;
  struct DomainDeleter {
    void operator()(OrtCustomOpDomain* d) const {
      if (d) g_ort->ReleaseCustomOpDomain(d);
    }
  };
  std::vector<std::unique_ptr<Op>> ops_;  // declared first: outlives the domains pointing at them
  std::unique_ptr<OrtCustomOpDomain, DomainDeleter> training_;
  std::vector<OrtCustomOpDomain*> domains_;  // the owned domains, as ORT takes them
};

}  // namespace ortmlx::ep
