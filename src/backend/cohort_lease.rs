//! API mode: a cohort's one point of agreement (docs/design.md, "Cohorts").
//!
//! Members of a cohort keep their charges in their own GPUQuota, so two namespaces
//! borrowing the same idle GPU at once would each write only their own object and both
//! succeed. A charge that draws on the cohort's pool is therefore agreed on one more
//! object, a `coordination.k8s.io` Lease per cohort in gpu-admission's namespace:
//!
//! 1. read the Lease (its resourceVersion), *then* the members' quotas, fresh;
//! 2. decide, and write the charge into the member's own quota as usual;
//! 3. write the Lease back with the resourceVersion read in 1.
//!
//! If 3 conflicts, another draw was agreed between 1 and 3 and this one may not have
//! seen it: the charge is given back and decided again. If it succeeds, every draw agreed
//! before it wrote its quota before its Lease write, which came before this one's read in
//! 1, so this decision saw it. Draws are thereby ordered one after another per cohort;
//! charges within a member's guaranteed part never touch the Lease.

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Client;
use kube::api::{Api, PostParams};

/// The namespace the Leases live in: gpu-admission's own (`POD_NAMESPACE` from the
/// downward API), where tenants have no rights.
pub(crate) fn lease_namespace() -> String {
    std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "gpu-admission".to_string())
}

/// The Lease name of cohort `cohort` (a DNS label, so the name is one too).
pub fn lease_name(cohort: &str) -> String {
    format!("gpu-admission-cohort-{cohort}")
}

/// The Leases of the cohorts a round draws on, as read before the members' quotas.
pub struct Agreement {
    leases: Vec<Lease>,
}

pub struct CohortLeases {
    api: Api<Lease>,
}

impl CohortLeases {
    pub fn new(client: Client) -> Self {
        CohortLeases {
            api: Api::namespaced(client, &lease_namespace()),
        }
    }

    /// Read the Lease of each of `cohorts` (created when missing), in name order.
    pub async fn read(&self, cohorts: &BTreeSet<String>) -> Result<Agreement, kube::Error> {
        let mut leases = Vec::with_capacity(cohorts.len());
        for cohort in cohorts {
            leases.push(self.read_one(&lease_name(cohort)).await?);
        }
        Ok(Agreement { leases })
    }

    async fn read_one(&self, name: &str) -> Result<Lease, kube::Error> {
        if let Some(lease) = self.api.get_opt(name).await? {
            return Ok(lease);
        }
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.to_string());
        lease.spec = Some(LeaseSpec {
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        });
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => Ok(created),
            // Another writer created it first.
            Err(kube::Error::Api(status)) if status.code == 409 => self.api.get(name).await,
            Err(error) => Err(error),
        }
    }

    /// Agree on what was decided since `agreement` was read: each Lease written back with
    /// the resourceVersion read. `Ok(false)`: another draw was agreed meanwhile.
    pub async fn agree(&self, agreement: Agreement) -> Result<bool, kube::Error> {
        for mut lease in agreement.leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            // An update that changes nothing keeps the resourceVersion: count the draws.
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            let draws = spec.lease_transitions.unwrap_or_default();
            spec.lease_transitions = Some(draws.checked_add(1).unwrap_or(0));
            lease.metadata.managed_fields = None;
            match self
                .api
                .replace(&name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(true)
    }
}
