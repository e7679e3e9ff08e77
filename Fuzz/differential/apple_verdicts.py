"""Verdicts of Apple's app-store-server-library (PyPI) on JWS lines, for the differential test.

Usage: apple_verdicts.py ROOT.der BUNDLE_ID APP_APPLE_ID ENVIRONMENT < lines
Each input line is `kind<TAB>jws` (kind: transaction, renewalInfo, notification, appTransaction); each output line is
`verified` or `rejected<TAB>STATUS` (the library's VerificationStatus name, or the exception type when the library
raised something else, e.g. while structuring a payload). Offline: enable_online_checks=False (no OCSP), so the
validation time is the payload's signedDate, as in the fleet's default policy. Exit 3 when the library is missing.
"""
import sys

try:
    from appstoreserverlibrary.models.Environment import Environment
    from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier, VerificationException
except ImportError as e:  # the Swift test skips on exit 3
    print(f"app-store-server-library is not installed: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    root_path, bundle_id, app_apple_id, environment = sys.argv[1:5]
    with open(root_path, "rb") as f:
        root = f.read()
    verifier = SignedDataVerifier([root], False, Environment(environment), bundle_id, int(app_apple_id))
    calls = {
        "transaction": verifier.verify_and_decode_signed_transaction,
        "renewalInfo": verifier.verify_and_decode_renewal_info,
        "notification": verifier.verify_and_decode_notification,
        "appTransaction": verifier.verify_and_decode_app_transaction,
    }
    out = []
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line:
            continue
        kind, jws = line.split("\t", 1)
        try:
            calls[kind](jws)
            out.append("verified")
        except VerificationException as e:
            out.append(f"rejected\t{e.status.name}")
        except Exception as e:  # noqa: BLE001 - any other failure is a rejection too
            out.append(f"rejected\t{type(e).__name__}")
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
