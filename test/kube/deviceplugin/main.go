// Command gpu-device-plugin offers a node's NVIDIA GPUs to the kubelet as the extended
// resource nvidia.com/gpu, as a vendor's device plugin does, for engines_plan.sh's kube
// part: a pod that asks for a GPU is then given the device nodes of the one the kubelet
// allocated it (and the driver's control nodes) instead of running privileged, and a pod
// restored from a checkpoint holds the nodes of the GPU it was given, not the checkpointed
// one's. A test fixture: each GPU is always healthy, and the plugin does not re-register
// after a kubelet restart.
//
//	gpu-device-plugin [-dev /dev] [-dir /var/lib/kubelet/device-plugins]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const resource = "nvidia.com/gpu"

// controlNodes are the driver's device nodes every CUDA process opens besides its GPU's.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	dev  string
	gpus []string // the GPUs' node names under dev: nvidia0, nvidia1, ...
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch lists the GPUs once, all healthy, and holds the stream open.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var devs []*pluginapi.Device
	for _, g := range p.gpus {
		devs = append(devs, &pluginapi.Device{ID: g, Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate gives each container the nodes of the GPUs it was allocated and the driver's
// control nodes.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		r := &pluginapi.ContainerAllocateResponse{}
		for _, id := range c.GetDevicesIds() {
			if !slices.Contains(p.gpus, id) {
				return nil, fmt.Errorf("no GPU %q on this node", id)
			}
			r.Devices = append(r.Devices, p.node(id))
		}
		for _, n := range controlNodes {
			if _, err := os.Stat(filepath.Join(p.dev, n)); err == nil {
				r.Devices = append(r.Devices, p.node(n))
			}
		}
		log.Printf("allocated %v", c.GetDevicesIds())
		out.ContainerResponses = append(out.ContainerResponses, r)
	}
	return out, nil
}

func (p *plugin) node(name string) *pluginapi.DeviceSpec {
	return &pluginapi.DeviceSpec{ContainerPath: "/dev/" + name, HostPath: filepath.Join(p.dev, name), Permissions: "rw"}
}

func main() {
	dev := flag.String("dev", "/dev", "where the GPUs' device nodes are")
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device plugin directory")
	flag.Parse()
	if err := run(*dev, *dir); err != nil {
		log.Fatalf("gpu-device-plugin: %v", err)
	}
}

func run(dev, dir string) error {
	entries, err := os.ReadDir(dev)
	if err != nil {
		return err
	}
	p := &plugin{dev: dev}
	for _, e := range entries {
		if gpuNode.MatchString(e.Name()) {
			p.gpus = append(p.gpus, e.Name())
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The kubelet empties its device plugin directory as it starts: the plugin's socket is
	// made once the kubelet answers on its own (a socket left by an earlier kubelet does not).
	kubelet := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	if err := waitFor(ctx, kubelet); err != nil {
		return err
	}
	const endpoint = "gpucr-gpu.sock"
	sock := filepath.Join(dir, endpoint)
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	if err := register(ctx, kubelet, endpoint); err != nil {
		return fmt.Errorf("register with the kubelet at %s: %w", kubelet, err)
	}
	log.Printf("registered %s with the kubelet: %d GPUs %v", resource, len(p.gpus), p.gpus)
	<-ctx.Done()
	return nil
}

// waitFor waits a minute at most for the kubelet to accept connections on its socket at path.
func waitFor(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no kubelet answers at %s: %w", path, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// register announces the plugin to the kubelet at the socket kubelet.
func register(ctx context.Context, kubelet, endpoint string) error {
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}
