//! Where the command-line tools (`explain`, `defrag`) read the cluster from: a file, or
//! one listing of the API server, as the planner in the cluster reads it too.

use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgGroup, Args};

use crate::cache::FileObject;
use crate::config::Config;

/// Where `defrag` and `explain` read the cluster and the configuration from.
#[derive(Debug, Args)]
#[command(group = ArgGroup::new("source").required(true).args(["cluster", "kubeconfig"]))]
pub(crate) struct ClusterSource {
    /// The cluster as a YAML file: Nodes, Pods, GPUQuotas, PodDisruptionBudgets and the
    /// ReplicaSets, StatefulSets and Jobs pods name as owners (`kind: List`s as
    /// `kubectl get -o yaml` prints them are read too).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Read the cluster from the API server this kubeconfig names.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Configuration file (YAML), as `serve` reads it.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The cluster's objects, what to call their source in messages, and the configuration.
pub(crate) struct Read {
    pub(crate) objects: Vec<FileObject>,
    pub(crate) source: String,
    pub(crate) config: Config,
}

impl ClusterSource {
    /// Read the configuration, then the objects from the file or the API server.
    pub(crate) fn read(&self) -> anyhow::Result<Read> {
        let config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        let (objects, source) = match (&self.cluster, &self.kubeconfig) {
            (Some(path), _) => (
                crate::cache::read_objects(path)?,
                path.display().to_string(),
            ),
            (None, Some(kubeconfig)) => {
                let runtime =
                    tokio::runtime::Runtime::new().context("starting the async runtime")?;
                let objects = runtime.block_on(listed(kubeconfig))?;
                let source = format!("the API server of {}", kubeconfig.display());
                (objects, source)
            }
            (None, None) => anyhow::bail!("give --cluster FILE or --kubeconfig FILE"),
        };
        Ok(Read {
            objects,
            source,
            config,
        })
    }
}

/// The objects of the cluster `kubeconfig` names, as a cluster file would hold them.
async fn listed(kubeconfig: &std::path::Path) -> anyhow::Result<Vec<FileObject>> {
    let client = crate::api_client::kube_client(Some(kubeconfig), None).await?;
    list_cluster(&client).await
}

/// What planning reads of the cluster, listed from the API server: Nodes, Pods,
/// GPUQuotas, PodDisruptionBudgets, and the controllers pods name as owners.
async fn list_cluster(client: &kube::Client) -> anyhow::Result<Vec<FileObject>> {
    use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    let client = client.clone();
    let mut objects = Vec::new();
    list::<Node>(&client, &mut objects).await?;
    list::<Pod>(&client, &mut objects).await?;
    list::<crate::quota::GPUQuota>(&client, &mut objects).await?;
    list::<PodDisruptionBudget>(&client, &mut objects).await?;
    list::<ReplicaSet>(&client, &mut objects).await?;
    list::<StatefulSet>(&client, &mut objects).await?;
    list::<Job>(&client, &mut objects).await?;
    Ok(objects)
}

/// Add every object of kind `K` the API server lists to `objects`.
async fn list<K>(client: &kube::Client, objects: &mut Vec<FileObject>) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    let kind = K::kind(&());
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .with_context(|| format!("listing {kind}s"))?;
    for item in list.items {
        let mut value = serde_yaml::to_value(&item).context("encoding an object")?;
        if let Some(map) = value.as_mapping_mut() {
            map.insert("kind".into(), kind.to_string().into());
            map.insert("apiVersion".into(), K::api_version(&()).to_string().into());
        }
        objects.push(FileObject {
            document: objects.len() + 1,
            value,
        });
    }
    Ok(())
}
