// The console's entry point: hash routes to views, the collapsible nav, and the sign-in dialog.
import { login, onUnauthorized } from "./api.js";
import { mountConfigure } from "./configure.js";
import { fill, h } from "./dom.js";
import { mountExperiences } from "./experiences.js";
import { mountRun } from "./run.js";
import { mountRuns } from "./runs.js";

const ROUTES = [
  [/^#\/configure$/, mountConfigure],
  [/^#\/runs\/([^/]+)\/experiences$/, mountExperiences],
  [/^#\/runs\/([^/]+)$/, mountRun],
  [/^#\/runs$/, mountRuns],
];

const main = document.getElementById("main");
let unmount = () => {};
let generation = 0;

async function route() {
  unmount();
  unmount = () => {};
  const hash = location.hash || "#/runs";
  const [, mount, match] = ROUTES.map(([re, fn]) => [re, fn, hash.match(re)]).find(([, , m]) => m) || [];
  if (!mount) {
    location.hash = "#/runs";
    return;
  }
  for (const link of document.querySelectorAll("#nav a")) {
    link.toggleAttribute("aria-current", hash.startsWith(link.getAttribute("href")));
  }
  closeNav();
  main.replaceChildren();
  const current = ++generation;
  try {
    const cleanup = (await mount(main, ...match.slice(1).map(decodeURIComponent))) || (() => {});
    if (current === generation) unmount = cleanup;
    else cleanup(); // the user moved on while this view was loading
  } catch (err) {
    if (current === generation) fill(main, h("p", { class: "error", role: "alert" }, err.message));
  }
}

const toggle = document.querySelector(".nav-toggle");
const nav = document.getElementById("nav");
function closeNav() {
  toggle.setAttribute("aria-expanded", "false");
  nav.classList.remove("open");
}
toggle.addEventListener("click", () => {
  const open = toggle.getAttribute("aria-expanded") !== "true";
  toggle.setAttribute("aria-expanded", String(open));
  nav.classList.toggle("open", open);
});

const dialog = document.getElementById("login");
let pendingLogin = null;
onUnauthorized(() => {
  pendingLogin ??= new Promise((resolve) => {
    const form = document.getElementById("login-form");
    const error = document.getElementById("login-error");
    form.onsubmit = async (event) => {
      event.preventDefault();
      if (await login(document.getElementById("login-token").value)) {
        dialog.close();
        pendingLogin = null;
        resolve();
      } else {
        error.textContent = "That token was refused.";
        error.hidden = false;
      }
    };
    dialog.showModal();
  });
  return pendingLogin;
});

window.addEventListener("hashchange", route);
route();
