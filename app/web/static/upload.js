// The upload page (/): each chosen or dropped file gets a row; it is sent with XMLHttpRequest to
// POST /v1/attachments (multipart field "file", the session's CSRF token in X-CSRF-Token), its
// state is polled from GET /v1/attachments/{id} until ready or failed, and then its thumbnail is
// shown. Plain JavaScript, no build step; the session cookie authenticates every request.
(function () {
  "use strict";

  var root = document.getElementById("uploader");
  if (!root) {
    return;
  }
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  var uploadUrl = root.getAttribute("data-upload-url");
  var maxBytes = Number(root.getAttribute("data-max-bytes"));
  var maxMb = root.getAttribute("data-max-mb");
  var input = document.getElementById("file");
  var zone = document.getElementById("dropzone");
  var list = document.getElementById("uploads");
  var empty = document.getElementById("no-uploads");

  var POLL_MS = 700;
  var MAX_POLL_MS = 5000;
  var PARALLEL = 3; // uploads in flight at once; the rest wait their turn
  var FORMATS = "JPEG, PNG, WebP, GIF, TIFF or BMP";

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
    if (status === 422) {
      return "The file changed in transit; try again";
    }
    if (status === 503) {
      return "The service is busy; try again in a moment";
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

  function send(row) {
    setState(row, "uploading");
    var form = new FormData();
    form.append("file", row.file, row.file.name);
    var xhr = new XMLHttpRequest();
    xhr.open("POST", uploadUrl);
    xhr.setRequestHeader("X-CSRF-Token", csrf);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = function (event) {
      if (event.lengthComputable && event.total > 0) {
        row.progress.value = Math.round((event.loaded / event.total) * 100);
      }
    };
    xhr.onload = function () {
      var body = parse(xhr.responseText);
      if ((xhr.status === 202 || xhr.status === 200) && body && body.id) {
        row.progress.value = 100;
        row.id = body.id;
        setState(row, body.state || "queued");
        settle(row, body);
      } else {
        setState(row, "refused", refusal(xhr.status, body));
      }
      finished();
    };
    xhr.onerror = function () {
      setState(row, "error", refusal(0, null));
      finished();
    };
    xhr.onabort = xhr.onerror;
    xhr.send(form);
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
