#!/bin/sh
# Zoomies: enroll this Proxmox VE cluster as the machine provider @NAME@ (MACH-21).
# Run as root on a node of the cluster. It makes (or keeps) the user zoomies@pve and the
# role ZoomiesProvider holding exactly the privileges the provider uses, adds a
# privilege-separated API token, grants the role on / to the user and the token, and sends
# the endpoint, the cluster CA and the token to Zoomies once. Nothing else is changed.
# ZOOMIES_PVE_ENDPOINT overrides the address Zoomies dials (default: this node's FQDN).
set -eu

PVE_DIR=${ZOOMIES_PVE_DIR:-/etc/pve}
ENDPOINT=${ZOOMIES_PVE_ENDPOINT:-https://$(hostname -f):8006}
USER_ID=zoomies@pve
ROLE=ZoomiesProvider
PRIVS=@PRIVILEGES@
# PVE 8 knows VM.Monitor, not PVE 9's VM.GuestAgent.Audit, and refuses a role naming either
# where it does not exist.
case "$(pveversion 2>/dev/null)" in
  pve-manager/[1-8].*) PRIVS=@PRIVILEGES_PVE8@ ;;
esac
TOKEN_NAME=@TOKEN_PREFIX@-$(date +%Y%m%d%H%M%S)
ENROLL_URL=@ENROLL_URL@

fail() { echo "zoomies: $*" >&2; exit 1; }

CA="$PVE_DIR/pve-root-ca.pem"
[ -r "$CA" ] || fail "no cluster CA at $CA: is this a Proxmox VE node?"
FINGERPRINT=
if [ -f "$PVE_DIR/local/pveproxy-ssl.pem" ]; then
  # A custom certificate is not signed by the cluster CA: Zoomies pins it instead.
  FINGERPRINT=$(openssl x509 -in "$PVE_DIR/local/pveproxy-ssl.pem" -noout -fingerprint \
    -sha256 | cut -d= -f2)
fi

if ! pveum user list --output-format json | grep -q "\"userid\": *\"$USER_ID\""; then
  pveum user add "$USER_ID" --comment "Zoomies machine provider"
fi
if pveum role list --output-format json | grep -q "\"roleid\": *\"$ROLE\""; then
  pveum role modify "$ROLE" --privs "$PRIVS"
else
  pveum role add "$ROLE" --privs "$PRIVS"
fi
TOKEN=$(pveum user token add "$USER_ID" "$TOKEN_NAME" --privsep 1 \
  --comment "Zoomies provider @NAME@" --output-format json)
TOKEN_ID=$(printf '%s\n' "$TOKEN" | sed -n 's/.*"full-tokenid": *"\([^"]*\)".*/\1/p')
SECRET=$(printf '%s\n' "$TOKEN" | sed -n 's/.*"value": *"\([^"]*\)".*/\1/p')
[ -n "$TOKEN_ID" ] && [ -n "$SECRET" ] || fail "pveum answered no token: $TOKEN_NAME"
# A privilege-separated token holds what both it and its user are granted: grant both.
pveum acl modify / --users "$USER_ID" --roles "$ROLE"
pveum acl modify / --tokens "$TOKEN_ID" --roles "$ROLE"

# The secret goes on stdin, never on a command line. PEM is base64 and dashes: only its
# line ends need escaping for JSON.
CA_JSON=$(awk '{ printf "%s\\n", $0 }' "$CA")
printf '{"endpoint":"%s","ca_pem":"%s","fingerprint":"%s","token_id":"%s","secret":"%s"}' \
  "$ENDPOINT" "$CA_JSON" "$FINGERPRINT" "$TOKEN_ID" "$SECRET" |
  curl -fsS -X POST -H 'Content-Type: application/json' --data-binary @- "$ENROLL_URL" \
  || fail "Zoomies refused the enrollment; remove the token: pveum user token remove $USER_ID $TOKEN_NAME"
echo
echo "zoomies: $ENDPOINT enrolled with token $TOKEN_ID; finish the provider in Zoomies"
