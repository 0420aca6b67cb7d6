package main

import (
	"cmp"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
)

// config is what gpucr takes from its environment. It is read once, at start, and passed
// down: the packages below cmd read no variable of their own.
type config struct {
	criu string         // GPUCR_CRIU: the CRIU binary when --criu is not given
	gpu  gpu.Config     // each GPU vendor's settings (gpu.Vendor.Settings)
	s3   store.S3Config // where S3 is and who we are there
	// trustedKeys (GPUCR_TRUSTED_KEYS) and signingKey (GPUCR_SIGNING_KEY) are this host's
	// signing policy: the keys images must be signed by, and the key checkpoints are signed
	// with, where a command names none.
	trustedKeys string
	signingKey  string
}

// configFrom reads the configuration through getenv. S3's endpoint is GPUCR_S3_ENDPOINT or
// AWS_ENDPOINT_URL, its region AWS_REGION or AWS_DEFAULT_REGION; credentials come from the
// standard AWS sources in their usual order, which minio-go's providers read when a store
// is opened: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, then the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials) for AWS_PROFILE.
// The instance metadata service is not asked: off EC2 it costs a timeout on every run.
func configFrom(getenv func(string) string) config {
	return config{
		criu:        getenv("GPUCR_CRIU"),
		trustedKeys: cmp.Or(getenv("GPUCR_TRUSTED_KEYS"), signing.HostTrustDir),
		signingKey:  cmp.Or(getenv("GPUCR_SIGNING_KEY"), signing.HostKey),
		gpu:         gpu.Config{Settings: vendorSettings(getenv)},
		s3: store.S3Config{
			Endpoint: cmp.Or(getenv("GPUCR_S3_ENDPOINT"), getenv("AWS_ENDPOINT_URL")),
			Region:   cmp.Or(getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION")),
			Creds:    credentials.NewChainCredentials([]credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}}),
		},
	}
}

// vendorSettings reads the settings every registered GPU vendor names.
func vendorSettings(getenv func(string) string) map[string]string {
	out := map[string]string{}
	for _, v := range gpu.Vendors() {
		for _, name := range v.Settings {
			if val := getenv(name); val != "" {
				out[name] = val
			}
		}
	}
	return out
}

// gpuConfig is the configuration backends open with, given the CRIU in use (a vendor's
// CRIU plugin lives beside it); criuPath may be empty when no CRIU was found.
func (a *app) gpuConfig(criuPath string) gpu.Config {
	c := a.cfg.gpu
	c.CRIU = criuPath
	return c
}

// criuBinary is the CRIU to run: --criu, else $GPUCR_CRIU; empty lets criu.Find look.
func (a *app) criuBinary() string { return cmp.Or(a.criuPath, a.cfg.criu) }
