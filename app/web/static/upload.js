// The upload page (/): each chosen or dropped file gets a row; it is sent as a resumable upload
// (tus, with tus-js-client from tus.min.js) to /v1/uploads in PATCHes of data-chunk-bytes, the
// session's CSRF token in X-CSRF-Token. A dropped connection (a phone in a tunnel, a restarting
// server) is retried and resumes from the offset the server reports; the same file chosen again
// after a reload resumes too. The final PATCH names the attachment (Attachment-Id), whose state is
// then polled from GET /v1/attachments/{id} until ready or failed, and then its thumbnail is shown.
// Plain JavaScript, no build step; the session cookie authenticates every request.
(function () {
  "use strict";

  var root = document.getElementById("uploader");
  if (!root) {
    return;
  }
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  var uploadUrl = root.getAttribute("data-upload-url");
  var resumableUrl = root.getAttribute("data-resumable-url");
  var chunkBytes = Number(root.getAttribute("data-chunk-bytes"));
  var maxBytes = Number(root.getAttribute("data-max-bytes"));
  var maxMb = root.getAttribute("data-max-mb");
  var input = document.getElementById("file");
  var zone = document.getElementById("dropzone");
  var list = document.getElementById("uploads");
  var empty = document.getElementById("no-uploads");

  var POLL_MS = 700;
  var MAX_POLL_MS = 5000;
  var PARALLEL = 3; // uploads in flight at once; the rest wait their turn
  // after a failed request, wait this long (ms) before each next try; progress starts the list again
  var RETRY_DELAYS = [0, 1000, 3000, 5000, 10000, 20000, 30000, 60000];
  var RESUMING = "Connection lost; resuming where it stopped…";
  var CHANGED = "The file changed on your device while it was being sent; choose it again";
  var FORMATS = "JPEG, PNG, WebP, GIF, TIFF, BMP, HEIC or AVIF";

  var STATE_WORDS = {
    waiting: "Waiting", uploading: "Uploading", queued: "Queued", processing: "Processing",
    ready: "Ready", failed: "Failed", refused: "Not accepted", error: "Error"
  };
  var FAILURE_WORDS = {
    corrupt_image: "the file could not be decoded; it is damaged or incomplete",
    decompression_bomb: "the image declares far more pixels than we process, like a decompression bomb",
    image_too_large: "the image is wider or taller than we process",
    unsupported_format: "it is not an image we process; we take " + FORMATS,
    worker_lost: "the worker processing it stopped each time it tried",
    step_timeout: "it took longer to process than we allow, each time it was tried",
    staging_missing: "the uploaded original was lost before it was processed; upload it again"
  };

  var waiting = [];
  var inFlight = 0;

  // --- rows ------------------------------------------------------------------------------

  function element(tag, className, text) {
    var node = document.createElement(tag);
    if (className) {
      node.className = className;
    }
    if (text !== undefined) {
      node.textContent = text;
    }
    return node;
  }

  function humanSize(bytes) {
    if (bytes < 1024) {
      return bytes + " B";
    }
    if (bytes < 1024 * 1024) {
      return (bytes / 1024).toFixed(0) + " KB";
    }
    return (bytes / (1024 * 1024)).toFixed(1) + " MB";
  }

  function addRow(file) {
    var item = element("li", "upload");
    item.setAttribute("data-file-name", file.name);
    var thumb = element("div", "thumb");
    var body = element("div", "body");
    var line = element("div", "line");
    var name = element("span", "name", file.name);
    var size = element("span", "size", humanSize(file.size));
    var state = element("span", "state");
    var progress = element("progress");
    progress.max = 100;
    progress.value = 0;
    progress.setAttribute("aria-label", "Upload of " + file.name);
    var message = element("p", "message");
    line.appendChild(name);
    line.appendChild(size);
    line.appendChild(state);
    body.appendChild(line);
    body.appendChild(progress);
    body.appendChild(message);
    item.appendChild(thumb);
    item.appendChild(body);
    list.appendChild(item);
    if (empty) {
      empty.hidden = true;
    }
    var row = { file: file, item: item, thumb: thumb, state: state, progress: progress, message: message,
                id: null, delay: POLL_MS, shown: null };
    setState(row, "waiting");
    return row;
  }

  function setState(row, state, text) {
    if (row.shown !== state) {
      row.shown = state;
      row.item.setAttribute("data-state", state);
      row.state.textContent = STATE_WORDS[state] || state;
    }
    if (text !== undefined && row.message.textContent !== text) {
      row.message.textContent = text;
    }
    if (state === "queued" || state === "processing") {
      row.progress.removeAttribute("value"); // indeterminate: the worker is on it
      row.progress.setAttribute("aria-label", "Processing " + row.file.name);
    }
    if (state === "ready" || state === "failed" || state === "refused" || state === "error") {
      row.progress.hidden = true;
    }
  }

  // --- refusals in plain words -------------------------------------------------------------

  function refusal(status, body) {
    var code = body && body.error;
    if (status === 413) {
      if (code === "decompression_bomb" || code === "image_too_large") {
        return "Too large: " + FAILURE_WORDS[code];
      }
      return "Too large: the limit is " + maxMb + " MB";
    }
    if (status === 415) {
      if (code === "corrupt_image") {
        return "Not accepted: " + FAILURE_WORDS.corrupt_image + " (corrupt_image)";
      }
      return "Not an image we process (" + FORMATS + ")";
    }
    if (status === 422 || status === 460) {
      return "The file changed in transit; try again";
    }
    if (status === 404 || status === 410) {
      return "The upload expired before it finished; choose the file again";
    }
    if (status === 429 && code === "too_many_open_uploads") {
      return "Too many of your uploads are unfinished; they expire a day after their last piece";
    }
    if (status === 429 && code === "too_many_uploads_at_once") {
      return "Too many of your uploads are being sent at once; try again in a moment";
    }
    if (status === 429) {
      return "Many of your uploads are still being processed; try again once some are ready";
    }
    if (status >= 502 && status <= 504) {
      return "The service is busy or away; choose the file again in a while to resume";
    }
    if (status === 401) {
      return "You are no longer signed in; reload the page and sign in again";
    }
    if (status === 403) {
      return code === "csrf" ? "This page is out of date; reload it and try again"
                             : "Your token is not allowed to upload";
    }
    if (status === 400 && body && body.message) {
      return "The upload was refused: " + body.message;
    }
    if (status === 0) {
      return "The upload did not reach the service; check the connection and try again";
    }
    return "Something went wrong (HTTP " + status + "); try again";
  }

  function parse(text) {
    try {
      return JSON.parse(text);
    } catch (e) {
      return null;
    }
  }

  // --- upload ---------------------------------------------------------------------------

  function addFiles(files) {
    for (var i = 0; i < files.length; i++) {
      var row = addRow(files[i]);
      if (files[i].size > maxBytes) {
        setState(row, "refused", refusal(413, null)); // the server would refuse it: do not send it
      } else if (files[i].size === 0) {
        setState(row, "refused", "The file is empty");
      } else {
        waiting.push(row);
      }
    }
    next();
  }

  function next() {
    while (inFlight < PARALLEL && waiting.length) {
      inFlight += 1;
      send(waiting.shift());
    }
  }

  function finished() {
    inFlight -= 1;
    next();
  }

  // The file's SHA-256 as RFC 9530 Repr-Digest: the service compares the joined pieces with it at the last one, so
  // a file that changed between two sessions of this page never becomes an attachment. Without Web Crypto (a page
  // not served over https or from localhost) the upload goes without it.
  function reprDigest(file) {
    if (!(window.crypto && window.crypto.subtle && file.arrayBuffer)) {
      return Promise.resolve(null);
    }
    return file.arrayBuffer().then(function (bytes) {
      return window.crypto.subtle.digest("SHA-256", bytes);
    }).then(function (digest) {
      var text = "";
      new Uint8Array(digest).forEach(function (byte) { text += String.fromCharCode(byte); });
      return "sha-256=:" + window.btoa(text) + ":";
    }, function () {
      return null;
    });
  }

  function send(row) {
    setState(row, "uploading");
    reprDigest(row.file).then(function (digest) {
      start(row, digest);
    });
  }

  // A key for the creation of one file's upload: sent again (its answer lost), the creation answers the upload it
  // made. Each lost answer had made another upload, left open and empty for a day and counted against the
  // uploader's limits, until every creation was refused (an adversarial run). Kept under the file's fingerprint
  // until the upload ends, as tus-js-client keeps the upload's URL, so the file chosen again after a reload sends
  // the same key (a new one each time left an empty upload open: a re-attack).
  function creationKey(file) {
    var name = ["attache-creation", resumableUrl, file.name, file.type, file.size, file.lastModified].join("/");
    var key = null;
    try {
      key = window.localStorage.getItem(name);
    } catch (e) { /* no storage: a key for this page only */ }
    if (!key) {
      var bytes = new Uint8Array(16);
      window.crypto.getRandomValues(bytes);
      key = Array.prototype.map.call(bytes, function (b) { return ("0" + b.toString(16)).slice(-2); }).join("");
      try {
        window.localStorage.setItem(name, key);
      } catch (e) { /* as above */ }
    }
    return {
      value: key,
      forget: function () {
        try {
          window.localStorage.removeItem(name);
        } catch (e) { /* as above */ }
      }
    };
  }

  // Whether the file can still be read as it was chosen. One changed on the device since (Chromium:
  // ERR_UPLOAD_FILE_CHANGED, a NotReadableError) fails every request that sends it as a dropped connection would.
  function stillReadable(file) {
    if (!file.slice || !file.slice(0, 1).arrayBuffer) {
      return Promise.resolve(true);
    }
    return file.slice(0, 1).arrayBuffer().then(function () { return true; }, function () { return false; });
  }

  // What the service says of an upload (a HEAD): {made: its attachment's id, or null while it is not finished}, or
  // null when it could not say (no answer, 5xx, 429).
  function whereItStands(url) {
    if (!url) {
      return Promise.resolve({ made: null });
    }
    return new Promise(function (resolve) {
      var request = new XMLHttpRequest();
      request.open("HEAD", url);
      request.setRequestHeader("Tus-Resumable", "1.0.0");
      request.setRequestHeader("X-CSRF-Token", csrf);
      request.onload = function () {
        var status = request.status;
        if (status >= 500 || status === 429) {
          resolve(null);
        } else {
          resolve({ made: status < 300 ? request.getResponseHeader("Attachment-Id") : null });
        }
      };
      request.onerror = function () { resolve(null); };
      request.send();
    });
  }

  // The answer an error carries: tus-js-client's own, or the one a failed HEAD was answered with (thrown below).
  function answerOf(err) {
    return err.originalResponse || (err.causingError && err.causingError.originalResponse) || null;
  }

  function start(row, digest) {
    var key = creationKey(row.file);
    var headers = { "X-CSRF-Token": csrf };
    if (digest) {
      headers["Repr-Digest"] = digest;
    }
    var over = false; // the row has its end: ready to poll, refused, in error or given up
    function end() {
      var first = !over;
      over = true;
      return first;
    }
    // A file changed mid-upload was taken for a lost connection: "resuming" for two minutes of retries, then "did
    // not reach the service", and its upload left open for a day, counted against the uploader (an adversarial
    // run). It is given up at once: the upload ended on the service, the row says why.
    // The upload may have ended before the file changed, its last answer lost: the service is asked first (a finished
    // upload was ended again, and the row said it was not accepted, though its attachment was made: a re-attack).
    function giveUpIfChanged() {
      stillReadable(row.file).then(function (readable) {
        return readable || over ? undefined : whereItStands(upload.url).then(function (stands) {
          if (!end()) {
            return;
          }
          key.forget();
          if (stands && stands.made) {
            upload.abort(false);
            row.id = stands.made;
            row.progress.value = 100;
            setState(row, "queued", "");
            poll(row);
          } else {
            setState(row, "refused", CHANGED);
            // ended on the service where it says it is not finished; where it could not say, it expires there
            upload.abort(!!stands).catch(function () { /* it expires on the service */ });
          }
          finished();
        });
      });
    }
    var upload = new tus.Upload(row.file, {
      endpoint: resumableUrl,
      chunkSize: chunkBytes,
      retryDelays: RETRY_DELAYS,
      metadata: { filename: row.file.name, filetype: row.file.type },
      headers: headers,
      removeFingerprintOnSuccess: true,
      onProgress: function (sent, total) {
        if (total > 0) {
          row.progress.value = Math.round((sent / total) * 100);
        }
      },
      onChunkComplete: function () {
        if (row.message.textContent === RESUMING) {
          setState(row, "uploading", ""); // it did resume
        }
      },
      onShouldRetry: function (err) {
        // as tus-js-client decides by default (not a 4xx but 409 and 423, and online), and 429 (too many of
        // this uploader's uploads still being processed: the upload waits where it is), and a PATCH cut short
        // (400 incomplete_body: the link went silent past the server's bound, and what arrived was kept: it
        // was taken as a refusal, and the upload given up, an adversarial run), saying so on the row
        var answer = answerOf(err);
        var status = answer ? answer.getStatus() : 0;
        var cutShort = status === 400 && /"error"\s*:\s*"incomplete_body"/.test(answer.getBody() || "");
        var retry = (status < 400 || status >= 500 || status === 409 || status === 423 || status === 429 ||
                     cutShort) && navigator.onLine !== false;
        if (!answer) {
          giveUpIfChanged();
        }
        if (retry) {
          row.item.setAttribute("data-resumed", "true");
          setState(row, "uploading", RESUMING);
        }
        return retry;
      },
      onBeforeRequest: function (request) {
        if (request.getMethod() === "POST") {
          request.setHeader("Idempotency-Key", key.value);
        }
      },
      onAfterResponse: function (request, response) {
        var made = response.getHeader("Attachment-Id"); // on the last PATCH, or a HEAD of a finished upload
        if (made) {
          row.id = made;
        }
        var status = response.getStatus();
        if (request.getMethod() === "HEAD" && (status >= 500 || status === 429)) {
          // tus-js-client takes any answer to its HEAD but 2xx and 423 for "the upload is gone" and starts a new
          // one from the first byte: a front proxy's 502 while the web restarted, or a 503 while PostgreSQL was
          // away, after a lost answer to the last PATCH, made a second attachment of the file, and an upload cut so
          // mid-way was left open for a day (an adversarial run). Failed, the HEAD is asked again after a delay.
          var failure = new Error("the service could not say where the upload stands (HTTP " + status + ")");
          failure.originalResponse = response; // for the row's words, if the retries run out
          throw failure;
        }
      },
      onSuccess: function () {
        if (!end()) {
          return;
        }
        key.forget();
        row.progress.value = 100;
        setState(row, "queued", "");
        if (row.id) {
          poll(row);
        } else {
          setState(row, "error", "The upload finished but the service did not name the attachment");
        }
        finished();
      },
      onError: function (err) {
        if (!end()) {
          return;
        }
        var response = answerOf(err);
        if (response && response.getStatus() < 500) {
          key.forget(); // refused: the upload is gone, or the service said why (a 5xx keeps it, to resume)
        }
        if (response && response.getStatus()) {
          setState(row, "refused", refusal(response.getStatus(), parse(response.getBody())));
        } else {
          setState(row, "error", refusal(0, null));
        }
        finished();
      }
    });
    // the same file chosen again (after a reload, say) resumes the upload it started
    upload.findPreviousUploads().then(function (previous) {
      if (previous.length) {
        upload.resumeFromPreviousUpload(previous[0]);
      }
      upload.start();
    });
  }

  // --- live state -----------------------------------------------------------------------

  function statusUrl(row) {
    return uploadUrl + "/" + encodeURIComponent(row.id);
  }

  function settle(row, body) {
    if (body.state === "ready") {
      setState(row, "ready", "");
      showThumbnail(row, body);
    } else if (body.state === "failed") {
      var words = FAILURE_WORDS[body.error_code];
      setState(row, "failed", "Processing failed: " + (words ? words + " (" + body.error_code + ")"
                                                             : (body.error_code || "unknown error")));
    } else {
      setState(row, body.state === "processing" ? "processing" : "queued",
               body.attempt > 1 ? "Retrying (attempt " + body.attempt + ")" : "");
      schedule(row);
    }
  }

  function schedule(row) {
    window.setTimeout(function () { poll(row); }, row.delay);
  }

  function poll(row) {
    var request = new XMLHttpRequest();
    request.open("GET", statusUrl(row));
    request.setRequestHeader("Accept", "application/json");
    request.onload = function () {
      var body = parse(request.responseText);
      if (request.status === 200 && body) {
        row.delay = POLL_MS;
        settle(row, body);
      } else if (request.status === 401 || request.status === 403 || request.status === 404) {
        setState(row, "error", request.status === 404 ? "The upload can no longer be found"
                                                      : refusal(request.status, body));
      } else {
        backOff(row); // 503, a restarting web process: keep asking, less often
      }
    };
    request.onerror = function () { backOff(row); };
    request.send();
  }

  function backOff(row) {
    row.delay = Math.min(row.delay * 2, MAX_POLL_MS);
    schedule(row);
  }

  function showThumbnail(row, body) {
    var thumbnail = body.variants && body.variants.thumbnail;
    if (!thumbnail || !thumbnail.url) {
      row.message.textContent = "Ready; there is no thumbnail to show";
      return;
    }
    var img = document.createElement("img");
    img.className = "thumbnail";
    img.alt = "Thumbnail of " + row.file.name;
    img.onerror = function () {
      row.message.textContent = "Ready, but the thumbnail could not be loaded";
    };
    img.src = thumbnail.url;
    row.thumb.appendChild(img);
  }

  // --- choosing and dropping ------------------------------------------------------------

  input.addEventListener("change", function () {
    if (input.files && input.files.length) {
      addFiles(input.files);
    }
    input.value = ""; // choosing the same file again uploads it again
  });

  function carriesFiles(event) {
    var types = event.dataTransfer && event.dataTransfer.types;
    return !!types && Array.prototype.indexOf.call(types, "Files") !== -1;
  }

  ["dragenter", "dragover"].forEach(function (type) {
    zone.addEventListener(type, function (event) {
      if (!carriesFiles(event)) {
        return;
      }
      event.preventDefault();
      event.dataTransfer.dropEffect = "copy";
      zone.classList.add("dragover");
    });
  });
  zone.addEventListener("dragleave", function (event) {
    if (!event.relatedTarget || !zone.contains(event.relatedTarget)) {
      zone.classList.remove("dragover");
    }
  });
  zone.addEventListener("drop", function (event) {
    event.preventDefault();
    zone.classList.remove("dragover");
    if (event.dataTransfer && event.dataTransfer.files.length) {
      addFiles(event.dataTransfer.files);
    }
  });
  // a file dropped beside the zone must not navigate away from uploads in progress
  window.addEventListener("dragover", function (event) {
    if (carriesFiles(event)) {
      event.preventDefault();
      if (!zone.contains(event.target)) {
        event.dataTransfer.dropEffect = "none";
      }
    }
  });
  window.addEventListener("drop", function (event) {
    if (carriesFiles(event)) {
      event.preventDefault();
    }
  });
})();
