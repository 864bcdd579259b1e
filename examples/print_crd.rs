//! Prints the `GPUQuota` CustomResourceDefinition as YAML, generated from the Rust type
//! (`cargo run --example print_crd > crd.yaml`). hack/e2e.sh installs the CRD this way.

use gpu_admission::quota::GPUQuota;
use kube::CustomResourceExt;

fn main() -> anyhow::Result<()> {
    print!("{}", serde_yaml::to_string(&GPUQuota::crd())?);
    Ok(())
}
