package redis

import (
	"errors"
	"testing"
)

func TestVersionFromInfo(t *testing.T) {
	for _, tc := range []struct {
		info    string
		tooOld  bool
		invalid bool
	}{
		{info: "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"},
		{info: "# Server\r\nredis_version:8.2.1\r\n"},
		{info: "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.0\r\n"},
		{info: "# Server\r\nredis_version:6.2.14\r\n", tooOld: true},
		{info: "# Server\r\nredis_version:5.0.7\r\n", tooOld: true},
		{info: "# Server\r\nredis_mode:standalone\r\n", invalid: true},
		{info: "# Server\r\nredis_version:seven\r\n", invalid: true},
	} {
		err := versionFromInfo(tc.info, "127.0.0.1:1")
		var verr *VersionError
		switch {
		case tc.tooOld:
			if !errors.Is(err, ErrServerTooOld) || !errors.As(err, &verr) || verr.Version == "" {
				t.Errorf("%q: %v, want a *VersionError matching ErrServerTooOld", tc.info, err)
			}
		case tc.invalid:
			if err == nil || errors.Is(err, ErrServerTooOld) || !errors.As(err, &verr) {
				t.Errorf("%q: %v, want a *VersionError not matching ErrServerTooOld", tc.info, err)
			}
		default:
			if err != nil {
				t.Errorf("%q: %v, want nil", tc.info, err)
			}
		}
	}
}
