//! `bypass-agent nodes`: the cluster-wide view of the per-node status objects the
//! agents publish (`k8s::node_status`): which nodes are bypassing, with which
//! guarantees, which are off, and which refused and why.

use crate::{cli::NodesOpts, error::AgentError, k8s::node_status};

/// Prints every node's status in `--namespace`.
pub fn nodes(opts: &NodesOpts) -> Result<(), AgentError> {
    let rt = crate::runtime::current_thread()?;
    let (list, existing) = rt.block_on(async {
        let client = crate::k8s::client::connect(opts.kubeconfig.as_deref()).await?;
        let list = node_status::list(&client, &opts.namespace).await?;
        // The cluster's nodes, where the caller may list them: a status whose node is
        // gone is shown so.
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let existing = nodes
            .list_metadata(&kube::api::ListParams::default())
            .await
            .ok()
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect::<Vec<_>>()
            });
        Ok::<_, AgentError>((list, existing))
    })?;
    if opts.json {
        super::print_json(&list, "the node list")?;
    } else if list.is_empty() {
        println!(
            "no node status in namespace {}: is the agent installed there?",
            opts.namespace
        );
    } else {
        print!(
            "{}",
            node_status::render_table(
                list,
                k8s_openapi::jiff::Timestamp::now(),
                existing.as_deref()
            )
        );
    }
    Ok(())
}
