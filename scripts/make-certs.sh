#!/usr/bin/env bash
# Self-signed CA and a SuperLink certificate for TLS deployments (development and tests only).
# Usage: bash scripts/make-certs.sh [OUT_DIR] [extra SAN entries, e.g. DNS:link.example.org IP:10.0.0.5]
# Writes OUT_DIR/ca.crt, ca.key, server.pem, server.key (default OUT_DIR: certificates/, which git ignores).
# The folder is mode 700 and the keys 600 from the moment they are written (umask); the certificates are public.
# asyncfl compose and asyncfl docker up write their own when none are given: this script is for asyncfl deploy
# and hand-made deployments.
set -euo pipefail
umask 077
out="${1:-certificates}"
shift || true
mkdir -p "$out"
chmod 700 "$out"
sans="DNS:localhost,DNS:superlink,IP:127.0.0.1,IP:10.77.0.1"
for extra in "$@"; do sans="$sans,$extra"; done
openssl req -x509 -newkey rsa:3072 -sha256 -days 365 -nodes -subj "/CN=asyncfl-dev-ca" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey rsa:3072 -sha256 -nodes -subj "/CN=superlink" \
  -keyout "$out/server.key" -out "$out/server.csr" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
  "$sans" > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days 365 -sha256 -extfile "$out/server.ext" -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 600 "$out/ca.key" "$out/server.key"
chmod 644 "$out/ca.crt" "$out/server.pem"
echo "wrote $out/ca.crt $out/server.pem, and the keys $out/ca.key $out/server.key (mode 600; SANs: $sans)"
