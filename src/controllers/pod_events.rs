//! Events gpu-admission records on pods (the quota queue's place in line, reclaim's
//! evictions): one recorder per task, published in the background.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::Instrument;

use crate::cache::pod::key_parts;

/// Records Events on pods as `gpu-admission`, this pod's name (`POD_NAME`, else the
/// host's) as the instance.
#[derive(Clone)]
pub struct PodEvents {
    recorder: Recorder,
}

impl PodEvents {
    pub fn new(client: kube::Client) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok();
        let reporter = Reporter {
            controller: "gpu-admission".into(),
            instance,
        };
        PodEvents {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publish an Event on pod `key` (`namespace/name`, uid `uid`) without waiting for
    /// it: a failure is logged, never in the way of what the event reports.
    pub fn publish(
        &self,
        key: &str,
        uid: &str,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let (namespace, name) = key_parts(key);
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.to_string()),
            ..Default::default()
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        // A child of the decision's span (when there is one), named for what it does.
        let span = tracing::debug_span!("pod_event", reason = %event.reason);
        let publish = async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::debug!(%error, "cannot publish a pod event");
            }
        };
        tokio::spawn(publish.instrument(span));
    }
}
