package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
)

// trustFlags are a command's --trust and --allow-unsigned, read by app.trusted.
type trustFlags struct {
	paths         []string
	allowUnsigned bool
}

func (t *trustFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&t.paths, "trust", nil,
		"refuse an image not signed by one of these ed25519 public keys (PEM files, or directories of *.pub; repeatable)")
	cmd.Flags().BoolVar(&t.allowUnsigned, "allow-unsigned", false,
		"accept an image not signed by a key of this host's trusted keys ("+signing.HostTrustDir+", or $GPUCR_TRUSTED_KEYS), this once")
}

// trusted reads the keys an image must be signed by: those of --trust, else this host's
// (none where the host has no policy, or with --allow-unsigned). None means unsigned images
// are accepted.
func (a *app) trusted(t trustFlags) (signing.Keys, error) {
	switch {
	case len(t.paths) > 0 && t.allowUnsigned:
		return nil, usageError{errors.New("--trust and --allow-unsigned contradict each other: give one")}
	case t.allowUnsigned:
		return nil, nil
	case len(t.paths) == 0:
		keys, err := signing.HostTrusted(a.cfg.trustedKeys)
		if keys != nil {
			a.hostTrust = a.cfg.trustedKeys
		}
		return keys, err
	}
	keys, err := signing.LoadTrusted(t.paths)
	if err != nil {
		return nil, usageError{err}
	}
	return keys, nil
}

// untrustedHint says what to do about an image this host's policy refused.
func (a *app) untrustedHint(err error) string {
	if a.hostTrust == "" || !errors.Is(err, signing.ErrUntrusted) {
		return ""
	}
	return " (this host trusts only images signed by a key in " + a.hostTrust + ": sign it with gpucr sign, or pass --allow-unsigned if you trust where it came from)"
}

// loadSigningKey reads the key of --sign, before anything is touched; without one, this
// host's own (a.cfg.signingKey), if it has one.
func (a *app) loadSigningKey(path string) (ed25519.PrivateKey, error) {
	if path == "" {
		return signing.HostSigningKey(a.cfg.signingKey)
	}
	key, err := signing.LoadPrivate(path)
	if err != nil {
		return nil, usageError{err}
	}
	return key, nil
}

type keygenOutput struct {
	Private string `json:"private"`
	Public  string `json:"public"`
	KeyID   string `json:"keyId"`
}

func (a *app) keygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen PATH",
		Short: "Create an ed25519 key pair for signing images: PATH (private, 0600) and PATH.pub",
		Example: examples(
			"gpucr keygen /etc/gpucr/signing-key # this host's key: its checkpoints are signed with it",
			"gpucr keygen alice # alice (private, 0600) and alice.pub, to hand to --trust",
		),
		Long: "keygen writes a new private key to PATH, which must not exist, and its public key to PATH.pub.\n" +
			"Sign with `gpucr checkpoint --sign PATH` or `gpucr sign DIR --key PATH`; restore, pull and\n" +
			"verify with `--trust PATH.pub` refuse images not signed by it. The files are the PEM formats\n" +
			"OpenSSL reads and writes (openssl genpkey -algorithm ed25519 makes a key gpucr accepts).",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := signing.CheckNewKeyPath(args[0]); err != nil {
				return usageError{err}
			}
			pub, err := signing.Generate(args[0])
			if err != nil {
				return err
			}
			out := keygenOutput{Private: args[0], Public: args[0] + signing.PublicSuffix, KeyID: signing.ID(pub)}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "key %s: private %s, public %s\n", out.KeyID, out.Private, out.Public)
			})
		},
	}
}

type signOutput struct {
	Dir   string `json:"dir"`
	KeyID string `json:"keyId"`
	// Dropped are the other keys whose signatures went: they covered a manifest without
	// the SHA-256 of each file, which signing added.
	Dropped []string `json:"droppedSignatures,omitempty"`
}

func (a *app) signCmd() *cobra.Command {
	var keyPath string
	cmd := &cobra.Command{
		Use:   "sign DIR [--key KEY]",
		Short: "Verify an image and add an ed25519 signature of its manifest",
		Example: examples(
			"gpucr sign /ckpt/train-1 --key alice # verify the image, then sign it with alice's key",
			"gpucr sign /ckpt/train-1 # with this host's key (/etc/gpucr/signing-key)",
		),
		Long: "sign verifies every file of the image at DIR, then signs its manifest with KEY. The manifest\n" +
			"records each file's SHA-256, so the signature covers every byte; an image checkpointed without\n" +
			"--sign (or by an older gpucr) gets them first, in the same read, and its manifest is written\n" +
			"again: signatures by other keys of the old manifest are then dropped (sign again with those\n" +
			"keys). Otherwise signatures by other keys are kept.",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			key, err := a.loadSigningKey(keyPath)
			if err != nil {
				return err
			}
			if key == nil {
				return usageError{fmt.Errorf("say which key signs: --key KEY (this host has no signing key at %s)", a.cfg.signingKey)}
			}
			signed, err := image.Sign(args[0], key)
			if err != nil {
				return err
			}
			out := signOutput{Dir: args[0], KeyID: signed.KeyID, Dropped: signed.Dropped}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "signed %s with key %s\n", out.Dir, out.KeyID)
				if len(out.Dropped) > 0 {
					fmt.Fprintf(a.stdout, "dropped the signatures of %s: they did not cover the files' bytes; sign again with those keys\n",
						strings.Join(out.Dropped, ", "))
				}
			})
		},
	}
	cmd.Flags().StringVar(&keyPath, "key", "", "the ed25519 private key (PEM, from gpucr keygen or openssl genpkey); default: this host's ("+signing.HostKey+", or $GPUCR_SIGNING_KEY)")
	return cmd
}
