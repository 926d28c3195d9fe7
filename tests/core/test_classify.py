import errno

import pytest

from retryfs import Decision, ErrorClassifier

C = ErrorClassifier()


class FakeClientError(Exception):
    """Shaped like botocore's ClientError: the classifier reads `response`, not the type."""

    def __init__(self, code, status):
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize(("exc", "decision"), [
    # pyarrow's native S3 errors: plain OSError, the text is the only signal
    (OSError("When uploading part for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION "
             "during UploadPart operation: curlCode: 56, Failure when receiving data from the peer"),
     Decision.RETRY),
    (OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."),
     Decision.THROTTLE),
    (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body."),
     Decision.RETRY),
    (OSError("AWS Error UNKNOWN (HTTP status 400) during HeadObject operation"), Decision.FAIL),
    (OSError("AWS Error INTERNAL_FAILURE during CompleteMultipartUpload operation"), Decision.RETRY),
    (OSError("AWS Error SERVICE_UNAVAILABLE during GetObject operation"), Decision.RETRY),
    (OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied"), Decision.FAIL),
    (OSError("AWS Error NO_SUCH_BUCKET during HeadBucket operation"), Decision.FAIL),
    (OSError("some error curlCode: 28, Timeout was reached"), Decision.RETRY),
    # builtins and errno
    (ConnectionResetError(errno.ECONNRESET, "reset"), Decision.RETRY),
    (TimeoutError("read timed out"), Decision.RETRY),
    (OSError(errno.ETIMEDOUT, "timed out"), Decision.RETRY),
    (FileNotFoundError(errno.ENOENT, "nope"), Decision.FAIL),
    (PermissionError(errno.EACCES, "denied"), Decision.FAIL),
    (ValueError("bad argument"), Decision.FAIL),
    (RuntimeError("who knows"), Decision.FAIL),
    # provider codes and HTTP statuses carried on the exception
    (FakeClientError("SlowDown", 503), Decision.THROTTLE),
    (FakeClientError("InternalError", 500), Decision.RETRY),
    (FakeClientError("AccessDenied", 403), Decision.FAIL),
    (FakeClientError("NoSuchBucket", 404), Decision.FAIL),
    (FakeClientError("Whatever", 502), Decision.RETRY),
    (FakeClientError("Whatever", 429), Decision.THROTTLE),
    (FakeClientError("Whatever", 408), Decision.RETRY),
])
def test_builtin_rules(exc, decision):
    assert C.classify(exc) is decision


def test_real_botocore_errors_are_classified_by_type_and_code():
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

    assert C.classify(EndpointConnectionError(endpoint_url="http://x")) is Decision.RETRY
    assert C.classify(ReadTimeoutError(endpoint_url="http://x")) is Decision.RETRY
    slow = ClientError({"Error": {"Code": "SlowDown", "Message": "reduce"},
                        "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    assert C.classify(slow) is Decision.THROTTLE
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "no"},
                          "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")
    assert C.classify(denied) is Decision.FAIL


def test_cause_chain_is_walked():
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError as inner:
            raise OSError("upload failed") from inner
    except OSError as outer:
        assert C.classify(outer) is Decision.RETRY


def test_permanent_beats_transient_in_the_chain():
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError:
            raise FileNotFoundError("gone")  # noqa: B904 - the implicit context is the point
    except FileNotFoundError as outer:
        assert C.classify(outer) is Decision.FAIL


def test_retryable_messages_take_ray_data_retried_io_errors_as_is():
    ray_data_defaults = ["AWS Error INTERNAL_FAILURE", "AWS Error NETWORK_CONNECTION",
                         "AWS Error SLOW_DOWN", "AWS Error UNKNOWN (HTTP status 503)"]
    c = ErrorClassifier(retryable_messages=ray_data_defaults + ["flaky backend hiccup"])
    assert c.classify(RuntimeError("flaky backend hiccup #42")) is Decision.RETRY
    assert C.classify(RuntimeError("flaky backend hiccup #42")) is Decision.FAIL
    with pytest.raises(TypeError, match="retryable_messages"):
        ErrorClassifier(retryable_messages="AWS Error")


def test_classifier_equality_and_pickle():
    import pickle

    a = ErrorClassifier(retryable_messages=["x"])
    assert a == ErrorClassifier(retryable_messages=["x"]) != C
    assert pickle.loads(pickle.dumps(a)) == a
