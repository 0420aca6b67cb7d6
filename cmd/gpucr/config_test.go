package main

import (
	"maps"
	"testing"
)

// gpucr's own S3 variables win over the AWS ones, and each setting is read from its variable.
func TestConfigFrom(t *testing.T) {
	tests := []struct {
		name             string
		env              map[string]string
		endpoint, region string
	}{
		{"none", nil, "", ""},
		{"aws", map[string]string{"AWS_ENDPOINT_URL": "http://aws:9000", "AWS_DEFAULT_REGION": "eu-west-1"}, "http://aws:9000", "eu-west-1"},
		{"gpucr's first", map[string]string{"GPUCR_S3_ENDPOINT": "http://minio:9000", "AWS_ENDPOINT_URL": "http://aws:9000",
			"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "eu-west-1"}, "http://minio:9000", "us-east-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := configFrom(func(k string) string { return tt.env[k] })
			if c.s3.Endpoint != tt.endpoint || c.s3.Region != tt.region {
				t.Errorf("S3 endpoint %q region %q, want %q %q", c.s3.Endpoint, c.s3.Region, tt.endpoint, tt.region)
			}
			if c.s3.Creds == nil {
				t.Error("no credential sources")
			}
		})
	}
	env := map[string]string{"GPUCR_CRIU": "/x/criu", "GPUCR_LIBCUDA": "/x/libcuda.so", "GPUCR_LIBNVML": "/x/libnvml.so"}
	c := configFrom(func(k string) string { return env[k] })
	if want := map[string]string{"GPUCR_LIBCUDA": "/x/libcuda.so", "GPUCR_LIBNVML": "/x/libnvml.so"}; c.criu != "/x/criu" || !maps.Equal(c.gpu.Settings, want) {
		t.Errorf("criu %q, GPU settings %+v; want /x/criu, %+v", c.criu, c.gpu.Settings, want)
	}
	a := &app{cfg: c}
	if got := a.criuBinary(); got != "/x/criu" {
		t.Errorf("CRIU without --criu = %q, want $GPUCR_CRIU", got)
	}
	a.criuPath = "/y/criu"
	if got := a.criuBinary(); got != "/y/criu" {
		t.Errorf("CRIU with --criu = %q, want --criu's", got)
	}
}
