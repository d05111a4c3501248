//go:build linux

package kubeenv

import (
	"fmt"
	"net"
	"os"
	"strings"

	"k8s.io/client-go/rest"
)

// writeConfig writes the PKI, kubeconfigs and the daemons' configuration
// files, and sets Config and Kubeconfig.
func (k *KubeNodeEnv) writeConfig() error {
	p, err := newKubePKI(k.path("pki"))
	if err != nil {
		return err
	}
	nodeIP := net.ParseIP(KubeNodeIP)
	loopback := net.ParseIP("127.0.0.1")
	// Client identities are what the authorizers expect: the Node
	// authorizer's system:node:<name> in system:nodes, the controllers' own
	// users, and system:masters for the admin and the apiserver's calls to
	// the kubelet (logs, exec).
	for _, id := range []pkiIdentity{
		{file: "apiserver", cn: "kube-apiserver", server: true,
			ips: []net.IP{loopback, nodeIP, net.ParseIP("10.96.0.1")},
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{file: "kubelet-serving", cn: KubeNodeName, server: true, ips: []net.IP{nodeIP, loopback}, dns: []string{KubeNodeName}},
		{file: "admin", cn: "kubernetes-admin", orgs: []string{"system:masters"}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{file: "kubelet", cn: "system:node:" + KubeNodeName, orgs: []string{"system:nodes"}},
		{file: "controller-manager", cn: "system:kube-controller-manager"},
		{file: "scheduler", cn: "system:kube-scheduler"},
		// Bound to system:node-proxier by the apiserver's default policy.
		{file: "kube-proxy", cn: "system:kube-proxy"},
	} {
		if err := p.issue(id); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKeys(); err != nil {
		return err
	}
	if err := os.MkdirAll(k.path("kubeconfigs"), 0o700); err != nil {
		return err
	}
	for _, user := range []string{"admin", "kubelet", "controller-manager", "scheduler", "kube-proxy"} {
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: conclave-node
  cluster: {server: "https://%s", certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: conclave-node
  context: {cluster: conclave-node, user: %s}
current-context: conclave-node
`, kubeNodeAPIServer, p.path("ca.crt"), user, p.path(user+".crt"), p.path(user+".key"), user)
		if err := os.WriteFile(k.path("kubeconfigs", user+".conf"), []byte(kc), 0o600); err != nil {
			return err
		}
	}
	k.Kubeconfig = k.path("kubeconfigs", "admin.conf")

	ca, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.path("admin.crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.path("admin.key"))
	if err != nil {
		return err
	}
	k.Config = &rest.Config{
		Host:            "https://" + kubeNodeAPIServer,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: cert, KeyData: key},
		Dial:            k.DialContext,
		// Tests create objects in bursts; client-side throttling would only
		// slow them down.
		QPS:   200,
		Burst: 400,
	}

	files := map[string]string{
		"containerd/config.toml":         k.containerdConfig(),
		"cni/net.d/10-conclave.conflist": k.cniConfig(),
		"kubelet-config.yaml":            k.kubeletConfig(),
	}
	for name, content := range files {
		if err := os.WriteFile(k.path(name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig keeps everything of containerd's under Dir, except the
// shim sockets, which containerd 1.6 always puts in /run/containerd/s.
func (k *KubeNodeEnv) containerdConfig() string {
	r := strings.NewReplacer("$DIR", k.Dir, "$PAUSE", PauseImage, "$CNI", "/usr/lib/cni")
	return r.Replace(`version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE"
  # Without CAP_SYS_RESOURCE (as in this sandbox) runc cannot lower
  # oom_score_adj to the -998 CRI asks for the pause container; this clamps
  # negative scores to containerd's own.
  restrict_oom_score_adj = true
  # Pod network namespaces pinned under the state dir, not /run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$DIR/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI"
    conf_dir = "$DIR/cni/net.d"
`)
}

// cniConfig is a bridge network for the pods, inside the namespace, with
// the bridge as their gateway: pods reach the node's addresses and nothing
// beyond the namespace.
func (k *KubeNodeEnv) cniConfig() string {
	return fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "conclave-node", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "loopback"}]}
`, kubeNodeCNIBridge, kubeNodePodSubnet, kubeNodePodGateway, k.path("cni", "ipam"))
}

func (k *KubeNodeEnv) kubeletConfig() string {
	r := strings.NewReplacer("$DIR", k.Dir, "$NODE_IP", KubeNodeIP)
	return r.Replace(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# This machine mounts cgroup v1 and runs no systemd. 1.34 still runs on v1
# by default; said explicitly so a later version cannot surprise us.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
podLogsDir: $DIR/pod-logs
# Else the kubelet creates /usr/libexec/kubernetes on the host.
volumePluginDir: $DIR/kubelet/volume-plugins
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-serving.key
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
rotateCertificates: false
serializeImagePulls: false
# A test machine's disk may be fuller than a real node's: never evict or
# garbage-collect the imported images (they cannot be pulled again).
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`)
}
